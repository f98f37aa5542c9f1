// PyTorch parity, forward and backward, in float32, float16 and bfloat16, against tensors written once by
// tests/oracle/ops_oracle.py; plus type promotion against torch.result_type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "castor/autograd.h"
#include "castor/ops.h"
#include "test_util.h"

namespace castor {
namespace {

using Inputs = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Inputs&, DType)>;

constexpr double kLo = -0.5, kHi = 0.75;  // the oracle's clamp bounds

// Each op of the oracle's OPS table; `d` is the case dtype (the target of cast_to).
const std::map<std::string, OpFn>& ops() {
  static const std::map<std::string, OpFn> table = {
      {"add", [](const Inputs& x, DType) { return x[0] + x[1]; }},
      {"sub_alpha", [](const Inputs& x, DType) { return sub(x[0], x[1], /*alpha=*/0.5); }},
      {"mul", [](const Inputs& x, DType) { return x[0] * x[1]; }},
      {"div", [](const Inputs& x, DType) { return x[0] / x[1]; }},
      {"neg", [](const Inputs& x, DType) { return -x[0]; }},
      {"relu", [](const Inputs& x, DType) { return relu(x[0]); }},
      {"abs", [](const Inputs& x, DType) { return abs(x[0]); }},
      {"sqrt", [](const Inputs& x, DType) { return sqrt(x[0]); }},
      {"clamp", [](const Inputs& x, DType) { return clamp(x[0], kLo, kHi); }},
      {"where", [](const Inputs& x, DType) { return where(x[0], x[1], x[2]); }},
      {"cast_from",
       [](const Inputs& x, DType) { return x[0].to(x[0].dtype() == DType::Float32 ? DType::BFloat16 : DType::Float32); }},
      {"cast_to", [](const Inputs& x, DType d) { return x[0].to(d); }},
      {"exp", [](const Inputs& x, DType) { return exp(x[0]); }},
      {"log", [](const Inputs& x, DType) { return log(x[0]); }},
      {"tanh", [](const Inputs& x, DType) { return tanh(x[0]); }},
      {"sigmoid", [](const Inputs& x, DType) { return sigmoid(x[0]); }},
      {"gelu", [](const Inputs& x, DType) { return gelu(x[0]); }},
      {"gelu_tanh", [](const Inputs& x, DType) { return gelu(x[0], /*tanh_approximate=*/true); }},
      {"softmax", [](const Inputs& x, DType) { return softmax(x[0], -1); }},
      {"log_softmax", [](const Inputs& x, DType) { return log_softmax(x[0], -1); }},
      {"softmax_dim0", [](const Inputs& x, DType) { return softmax(x[0], 0); }},
      {"sum_dim", [](const Inputs& x, DType) { return sum(x[0], {1}); }},
      {"mean_dim", [](const Inputs& x, DType) { return mean(x[0], {-1}); }},
      {"sum_all", [](const Inputs& x, DType) { return sum(x[0]); }},
      {"add_broadcast", [](const Inputs& x, DType) { return x[0] + x[1]; }},
      {"mm", [](const Inputs& x, DType) { return mm(x[0], x[1]); }},
      {"addmm", [](const Inputs& x, DType) { return addmm(x[0], x[1], x[2]); }},
      {"matmul_batched", [](const Inputs& x, DType) { return matmul(x[0], x[1]); }},
      {"bmm", [](const Inputs& x, DType) { return bmm(x[0], x[1]); }},
      {"pow3", [](const Inputs& x, DType) { return pow(x[0], /*exponent=*/3.0); }},
      {"silu", [](const Inputs& x, DType) { return silu(x[0]); }},
      {"max_dim", [](const Inputs& x, DType) { return max(x[0], /*dim=*/1).first; }},
      {"min_dim", [](const Inputs& x, DType) { return min(x[0], /*dim=*/0).first; }},
      {"cat", [](const Inputs& x, DType) { return cat({x[0], x[1]}, /*dim=*/1); }},
      {"stack", [](const Inputs& x, DType) { return stack({x[0], x[1]}, /*dim=*/0); }},
      {"gather",
       [](const Inputs& x, DType) {
         std::vector<double> idx;
         for (int i = 0; i < 6; ++i)
           for (int j = 0; j < 4; ++j) idx.push_back((i * 3 + j * 2) % 7);
         return gather(x[0], /*dim=*/1, tensor(idx, Shape{6, 4}, DType::Int64));
       }},
      {"masked_fill", [](const Inputs& x, DType) { return masked_fill(x[0], x[1], /*value=*/2.5); }},
      {"permute", [](const Inputs& x, DType) { return x[0].permute({1, 0, 2}); }},
      {"expand", [](const Inputs& x, DType) { return x[0].expand({3, 6, 7}); }},
      {"slice", [](const Inputs& x, DType) { return x[0].slice(1, 1, 6, 2); }},
      {"clone", [](const Inputs& x, DType) { return x[0].clone(); }},
      {"view", [](const Inputs& x, DType) { return x[0].view({7, 6}); }},
  };
  return table;
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
    const std::string dir = test::scratch_dir() + "/ops_oracle";
    if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0) return;
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
      auto op = ops().find(c.op);
      ASSERT_NE(op, ops().end()) << "no castor op for oracle op " << c.op;
      Inputs in;
      for (int i = 0; i < c.n_inputs; ++i) {
        Tensor t = ref(c.name + ".in" + std::to_string(i)).clone();
        if (is_floating(t.dtype())) t.requires_grad_();
        in.push_back(t);
      }
      const size_t colon = c.klass.find(':');
      const std::string fwd_class = c.klass.substr(0, colon), bwd_class = c.klass.substr(colon + 1);
      Tensor out = op->second(in, c.dtype);
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
