// kernels::matmul_add, the product added into a float32 (float64) destination that linear_cross_entropy's backward
// sums its blocks of classes in: against the float64 sum of the destination and the exact products.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace castor {
namespace {

// Every element of `got` within float32's accumulation error (2^-20 of `magnitude`, the sum of the magnitudes of
// what was added) of the float64 `exact`. A 16-bit rounding anywhere (2^-8 or 2^-11 relative) would miss it, and so
// would a destination overwritten rather than added to.
void expect_float32_sum(const Tensor& got, const Tensor& exact, const Tensor& magnitude) {
  ASSERT_EQ(got.shape(), exact.shape());
  const std::vector<double> g = got.to_vector<double>(), e = exact.to_vector<double>(),
                            m = magnitude.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(g[i] - e[i]), std::ldexp(m[i], -20)) << "element " << i << ": " << g[i] << " vs " << e[i];
}

TEST(MatmulAdd, AddsExactProductsInFloat32) {
  Generator gen(38);
  // bfloat16 runs on oneDNN's bf16 kernel with a float32 destination (on CPUs with bf16 units), float16 on exact
  // float32 copies, float32 and float64 as themselves.
  for (DType dt : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType acc = dt == DType::Float64 ? DType::Float64 : DType::Float32;
    // A row-major left operand and a row-major right one (the head's input gradient, dlogits W), then a
    // column-major right one.
    // An odd depth as well (a 259-class head's input gradient: 2016 rows of 259 classes into 64 features).
    for (const auto& [m, k, n] : {std::array<int64_t, 3>{130, 300, 70}, std::array<int64_t, 3>{2016, 259, 64}}) {
      SCOPED_TRACE(k);
      const Tensor a = randn({m, k}, DType::Float32, &gen).to(dt), b = randn({k, n}, DType::Float32, &gen).to(dt);
      const Tensor start = randn({m, n}, DType::Float32, &gen).to(acc);
      for (const Tensor& right : {b, b.t().contiguous().t()}) {
        Tensor dst = start.clone();
        kernels::matmul_add(a, right, dst);
        kernels::matmul_add(a, right, dst);  // twice: each call adds to what the last one left
        const Tensor a64 = a.double_(), b64 = right.double_(), s64 = start.double_();
        expect_float32_sum(dst, add(s64, mm(a64, b64) * 2.0), add(abs(s64), mm(abs(a64), abs(b64)) * 2.0));
      }
    }
  }
}

}  // namespace
}  // namespace castor
