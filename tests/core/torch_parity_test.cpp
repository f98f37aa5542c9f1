// PyTorch parity, forward and backward, in float32, float16 and bfloat16: the op table's parity cases
// (tests/autograd/op_cases.cpp) against tensors tests/oracle/ops_oracle.py writes for them; plus type promotion
// against torch.result_type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "autograd/op_cases.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "test_util.h"

namespace castor {
namespace {

using test::Inputs;

// The cases of tests/autograd/op_cases.cpp, by name.
const std::map<std::string, const test::ParityCase*>& parity_by_name() {
  static const std::map<std::string, const test::ParityCase*> by_name = [] {
    std::map<std::string, const test::ParityCase*> m;
    for (const auto& [op, c] : test::parity_cases()) {
      CASTOR_CHECK(m.emplace(c.name, &c).second, "two parity cases named ", c.name);
    }
    return m;
  }();
  return by_name;
}

// The oracle's input: one case a line, its fields (none holds a tab) tab-separated.
void write_case_list(const std::string& path) {
  std::ofstream f(path);
  for (const auto& [name, c] : parity_by_name())
    f << name << '\t' << c->klass << '\t' << c->reference << '\t' << c->dtypes << '\t' << c->inputs << '\t' << c->torch
      << '\t' << c->f32_grad << '\n';
}

struct Case {
  std::string name, op;
  DType dtype;
  std::string klass;  // "<forward class>:<backward class>", each exact, ulp or reduce
  int n_inputs;
};
struct Promotion {
  DType a, b, expected;
  int a_dims, b_dims;
};

// Distance in units in the last place of the dtype (sign-magnitude bits mapped onto a line); 0 for two NaNs.
int64_t ulps(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  const bool wide = a.dtype() == DType::Float32;
  auto ordered = [wide](const Tensor& t, int64_t i) -> int64_t {
    int64_t bits, sign;
    if (wide) {
      uint32_t u;
      std::memcpy(&u, static_cast<const char*>(t.data_ptr()) + 4 * i, 4);
      bits = u & 0x7fffffff, sign = u >> 31;
    } else {
      uint16_t u;
      std::memcpy(&u, static_cast<const char*>(t.data_ptr()) + 2 * i, 2);
      bits = u & 0x7fff, sign = u >> 15;
    }
    return sign ? -bits : bits;
  };
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  int64_t worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(xv[i]) && std::isnan(yv[i])) continue;
    if (std::isnan(xv[i]) != std::isnan(yv[i])) return INT64_MAX;
    worst = std::max(worst, std::abs(ordered(x, i) - ordered(y, i)));
  }
  return worst;
}

// The unit roundoff used by the "reduce" class: the results of both libraries are sums rounded once (or, after a
// broadcast backward, twice) from float32 accumulations in different orders.
double reduce_eps(DType d) {
  switch (d) {
    case DType::BFloat16: return 0x1p-7;
    case DType::Float16: return 0x1p-10;
    default: return 1e-5;
  }
}

class TorchParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const test::ScratchDir dir("ops_oracle");
    write_case_list(dir + "/cases.txt");
    if (!test::run_oracle("ops_oracle.py", {dir})) return;
    std::ifstream manifest(dir + "/manifest.txt");
    std::string line;
    while (std::getline(manifest, line)) {
      std::istringstream is(line);
      std::string kind;
      is >> kind;
      if (kind == "tensor") {
        std::string name, dt;
        int nd;
        is >> name >> dt >> nd;
        Shape shape(nd);
        for (auto& s : shape) is >> s;
        std::ifstream f(dir + "/" + name + ".bin", std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const DType d = parse_dtype(dt);
        EXPECT_EQ(bytes.size(), shape_numel(shape) * dtype_size(d)) << name;
        tensors()[name] = from_blob(bytes.data(), shape, d);
      } else if (kind == "case") {
        Case c;
        std::string dt;
        is >> c.name >> c.op >> dt >> c.klass >> c.n_inputs;
        c.dtype = parse_dtype(dt);
        cases().push_back(c);
      } else if (kind == "promote") {
        std::string a, b, r;
        Promotion p;
        is >> a >> p.a_dims >> b >> p.b_dims >> r;
        p.a = parse_dtype(a), p.b = parse_dtype(b), p.expected = parse_dtype(r);
        promotions().push_back(p);
      }
    }
  }
  static std::map<std::string, Tensor>& tensors() {
    static std::map<std::string, Tensor> t;
    return t;
  }
  static std::vector<Case>& cases() {
    static std::vector<Case> c;
    return c;
  }
  static std::vector<Promotion>& promotions() {
    static std::vector<Promotion> p;
    return p;
  }

  static const Tensor& ref(const std::string& name) {
    auto it = tensors().find(name);
    CASTOR_CHECK(it != tensors().end(), "the oracle wrote no tensor ", name);
    return it->second;
  }

  static void expect_match(const Tensor& got, const Tensor& want, const std::string& klass, const std::string& what) {
    ASSERT_TRUE(got.defined()) << what << ": no tensor";
    ASSERT_EQ(got.dtype(), want.dtype()) << what;
    ASSERT_EQ(got.shape(), want.shape()) << what;
    if (klass == "exact") {
      EXPECT_TRUE(test::bit_equal(got, want)) << what;
    } else if (klass == "ulp") {
      // Within 1 ulp of a 16-bit type. float32: within 8 ulps (libm vs Sleef, and gelu's derivative
      // cdf + x pdf, which cancels for x < 0, against its float64 value).
      const int64_t allowed = got.dtype() == DType::Float32 ? 8 : 1;
      EXPECT_LE(ulps(got, want), allowed) << what;
    } else {
      const double eps = reduce_eps(got.dtype());
      double scale = 0;
      for (double v : want.to_vector<double>()) scale = std::max(scale, std::abs(v));
      EXPECT_TRUE(test::close(got, want, /*rtol=*/eps, /*atol=*/eps * scale)) << what;
    }
  }

  static void check_dtype(DType d) {
    ASSERT_FALSE(cases().empty()) << "the oracle produced no cases";
    int run = 0;
    for (const Case& c : cases()) {
      if (c.dtype != d) continue;
      SCOPED_TRACE(c.name);
      ++run;
      auto op = parity_by_name().find(c.op);
      ASSERT_NE(op, parity_by_name().end()) << "no case " << c.op << " in tests/autograd/op_cases.cpp";
      Inputs in;
      for (int i = 0; i < c.n_inputs; ++i) {
        Tensor t = ref(c.name + ".in" + std::to_string(i)).clone();
        if (is_floating(t.dtype())) t.requires_grad_();
        in.push_back(t);
      }
      const size_t colon = c.klass.find(':');
      const std::string fwd_class = c.klass.substr(0, colon), bwd_class = c.klass.substr(colon + 1);
      Tensor out = op->second->fn(in, c.dtype);
      expect_match(out, ref(c.name + ".out"), fwd_class, "forward");
      out.backward(ref(c.name + ".gout"));
      for (int i = 0; i < c.n_inputs; ++i)
        if (is_floating(in[i].dtype()))
          expect_match(in[i].grad(), ref(c.name + ".grad" + std::to_string(i)), bwd_class,
                       "gradient of input " + std::to_string(i));
    }
    EXPECT_GE(run, 25) << "cases for " << dtype_name(d);
  }
};

TEST_F(TorchParity, Float32) { check_dtype(DType::Float32); }
TEST_F(TorchParity, Float16) { check_dtype(DType::Float16); }
TEST_F(TorchParity, BFloat16) { check_dtype(DType::BFloat16); }

TEST_F(TorchParity, TypePromotion) {
  ASSERT_EQ(promotions().size(), 256u);
  for (const Promotion& p : promotions()) {
    const Tensor a = zeros(Shape(p.a_dims, 2), p.a), b = zeros(Shape(p.b_dims, 2), p.b);
    EXPECT_EQ(result_type({a, b}), p.expected) << a.describe() << " with " << b.describe();
    if (p.a == DType::Bool && p.b == DType::Bool) continue;  // add of two bools is not defined here
    EXPECT_EQ(add(a, b).dtype(), p.expected) << "add of " << a.describe() << " and " << b.describe();
  }
}

}  // namespace
}  // namespace castor
