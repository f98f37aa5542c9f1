// Test helpers: the PyTorch oracle runner, tensor comparisons, and float64 finite differences.
#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "castor/autograd.h"
#include "castor/fs.h"
#include "castor/ops.h"
#include "castor/random.h"

namespace castor::test {

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  return {b.begin(), b.end()};
}

void write_tiny_cifar10(const std::string& dir, int per_batch) {
  std::filesystem::create_directories(dir);
  Generator gen(5);
  auto write_batch = [&](const std::string& name, int records) {
    std::vector<uint8_t> bytes(static_cast<size_t>(records) * 3073);
    for (int r = 0; r < records; ++r) {
      const uint8_t label = static_cast<uint8_t>(r % 10);
      bytes[r * 3073] = label;
      for (int k = 1; k < 3073; ++k)
        bytes[r * 3073 + k] = static_cast<uint8_t>((label * 25 + gen.next_u64() % 40) & 255);
    }
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << dir << "/" << name;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  };
  for (int i = 1; i <= 5; ++i) write_batch("data_batch_" + std::to_string(i) + ".bin", per_batch);
  write_batch("test_batch.bin", 30);
}

std::map<std::string, Tensor> read_oracle_case(const std::string& path) {
  std::map<std::string, Tensor> c;
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << "the oracle wrote no " << path;
  if (!f) return c;
  uint32_t len;
  while (std::fread(&len, 4, 1, f) == 1) {
    std::string key(len, '\0');
    uint32_t kind, ndim;
    EXPECT_EQ(std::fread(key.data(), 1, len, f), len);
    EXPECT_EQ(std::fread(&kind, 4, 1, f), 1u);
    EXPECT_EQ(std::fread(&ndim, 4, 1, f), 1u);
    Shape shape(ndim);
    EXPECT_EQ(std::fread(shape.data(), 8, ndim, f), ndim);
    Tensor t = empty(shape, kind == 1 ? DType::Int64 : DType::Float64);
    EXPECT_EQ(std::fread(t.data_ptr(), 8, t.numel(), f), static_cast<size_t>(t.numel()));
    c[key] = t;
  }
  std::fclose(f);
  return c;
}

bool run_oracle(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = "/usr/bin/python3 '" + std::string(CASTOR_SOURCE_DIR) + "/tests/oracle/" + script + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  std::string output;
  const int rc = run_command(cmd, &output);
  if (rc != 0) {
    ADD_FAILURE() << "the PyTorch oracle failed (" << cmd << "), exit " << rc << ":\n" << output;
    return false;
  }
  return true;
}

::testing::AssertionResult close(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << a.describe() << " vs " << b.describe();
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (std::isinf(y[i]) && x[i] == y[i]) continue;
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i])))
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs expected " << y[i] << " (rtol "
                                           << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.describe() << " vs " << b.describe();
  Tensor x = a.contiguous(), y = b.contiguous();
  const size_t es = a.element_size();
  const char* p = static_cast<const char*>(x.data_ptr());
  const char* q = static_cast<const char*>(y.data_ptr());
  auto v = x.to_vector<double>(), w = y.to_vector<double>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(v[i]) && std::isnan(w[i])) continue;
    if (std::memcmp(p + i * es, q + i * es, es) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << v[i] << " vs expected " << w[i] << " (" << a.describe() << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                     std::vector<Tensor> inputs, double eps, double tol) {
  Generator gen(1234);
  for (Tensor& t : inputs) t = t.to(DType::Float64).detach().clone().requires_grad_(t.requires_grad());
  Tensor out = f(inputs);
  Tensor w = randn(out.shape(), DType::Float64, &gen);
  sum(out * w).backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    if (!x.grad().defined()) return ::testing::AssertionFailure() << "input " << k << " got no gradient";
    auto analytic = x.grad().to_vector<double>();
    double* p = x.detach().data<double>();
    // Grad mode stays on: f may itself differentiate (a gradient penalty through castor::grad).
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double orig = p[i];
      p[i] = orig + eps;
      const double plus = sum(f(inputs) * w).item();
      p[i] = orig - eps;
      const double minus = sum(f(inputs) * w).item();
      p[i] = orig;
      const double numeric = (plus - minus) / (2 * eps);
      if (std::abs(numeric - analytic[i]) > tol * (1 + std::abs(numeric)))
        return ::testing::AssertionFailure() << "input " << k << " element " << i << ": autograd " << analytic[i]
                                             << " vs finite difference " << numeric;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace castor::test
