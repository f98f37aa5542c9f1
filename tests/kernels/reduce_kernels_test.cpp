// kernels::sum_of_squares (the gradient norm of clip_grad_norm_) against a plain float64 loop over the same values,
// for every float dtype, sizes around the parallel block and strided input; and the same bits on 1 and 2 threads;
// with a scale (the fused unscale's norm): the squares of the float32 products, and the inf/NaN check.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "castor/random.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace castor {
namespace {

double plain_sum_of_squares(const Tensor& t) {
  double total = 0;
  for (double v : t.to_vector<double>()) total += v * v;
  return total;
}

TEST(ReduceKernels, SumOfSquaresMatchesAFloat64Loop) {
  Generator gen(3);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64})
    for (int64_t n : {0, 1, 7, 2048, 3 * 2048 + 13, 100000}) {
      SCOPED_TRACE(detail::cat(dtype_name(dt), " n=", n));
      const Tensor x = randn({n}, DType::Float32, &gen).mul_(3.0).to(dt);
      const double want = plain_sum_of_squares(x), got = kernels::sum_of_squares(x);
      EXPECT_LE(std::abs(got - want), 1e-13 * want);
    }
  const Tensor m = randn({300, 50}, DType::Float32, &gen), t = m.t();  // not contiguous
  EXPECT_LE(std::abs(kernels::sum_of_squares(t) - plain_sum_of_squares(t)), 1e-13 * plain_sum_of_squares(t));
}

TEST(ReduceKernels, ScaledSumOfSquaresIsTheUnscaledGradientsAndFlagsInfAndNan) {
  Generator gen(4);
  const float inv = 1.0f / 3000.0f;
  for (DType dt : {DType::Float32, DType::Float16})
    for (int64_t n : {1, 13, 2048, 3 * 2048 + 13}) {
      SCOPED_TRACE(detail::cat(dtype_name(dt), " n=", n));
      const Tensor x = randn({n}, DType::Float32, &gen).mul_(3000.0).to(dt);
      double want = 0;  // each value times inv rounded to float32 (what unscale stores), squared in float64
      for (float v : x.to(DType::Float32).to_vector<float>()) {
        const double u = static_cast<float>(v * inv);
        want += u * u;
      }
      bool bad = true;
      EXPECT_LE(std::abs(kernels::sum_of_squares(x, inv, &bad) - want), 1e-13 * want);
      EXPECT_FALSE(bad);
      for (double special : {std::numeric_limits<double>::infinity(), std::nan("")}) {
        Tensor y = x.clone();
        y.narrow(0, n - 1, 1).fill_(special);  // the last element: the scalar tail or a vector lane
        bad = false;
        kernels::sum_of_squares(y, inv, &bad);
        EXPECT_TRUE(bad) << special;
      }
    }
}

TEST(ReduceKernels, SumOfSquaresIsTheSameOnAnyThreadCount) {
  const Tensor x = randn({1 << 20}, DType::Float32);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = kernels::sum_of_squares(x);
  omp_set_num_threads(2);
  const double two = kernels::sum_of_squares(x);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace castor
