// The float32 emulation of 16-bit matrix products (float16 here; bfloat16 without oneDNN bf16 kernels, the IsaCap.*
// runs), which works a tile at a time: against the float64 product of the same 16-bit inputs, rounded once, with
// operands of several tiles in every dimension, transposed operands, batches and a bias; and narrow bfloat16 products
// on whatever kernels this CPU runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/kernels.h"
#include "kernels/rounded_once.h"
#include "test_util.h"

namespace castor {
namespace {

using test::expect_rounded_once;

TEST(MatmulEmulation, TiledProductsAreRoundedOnceFromFloat32Sums) {
  Generator gen(21);
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    // 600 x 1100 x 700: two row tiles, two column tiles and three depth tiles of the emulation.
    const Tensor a = randn({600, 1100}, DType::Float32, &gen).to(dt);
    const Tensor bt = randn({700, 1100}, DType::Float32, &gen).to(dt);  // b = bt^T: a column-major operand
    const Tensor bias = randn({700}, DType::Float32, &gen).to(dt);
    const Tensor a64 = a.double_(), b64 = bt.t().double_(), m = mm(abs(a64), abs(b64));
    expect_rounded_once(mm(a, bt.t()), mm(a64, b64), m);
    expect_rounded_once(addmm(bias, a, bt.t()), add(mm(a64, b64), bias.double_()), add(m, abs(bias.double_())));
    // A column-major left operand and a row-major right one (a linear's weight gradient, dY^T X).
    const Tensor at = a.t().contiguous(), b = bt.t().contiguous();
    expect_rounded_once(mm(at.t(), b), mm(a64, b64), m);
    // Batched, each matrix its own.
    const Tensor x = randn({3, 70, 90}, DType::Float32, &gen).to(dt),
                 y = randn({3, 90, 50}, DType::Float32, &gen).to(dt);
    expect_rounded_once(bmm(x, y), bmm(x.double_(), y.double_()), bmm(abs(x.double_()), abs(y.double_())));
  }
}

// Narrow column-major bfloat16 right operands (a Linear's weight of a few dozen outputs, a 53-token vocabulary's head)
// on whatever products this CPU runs: oneDNN 2.6's AMX kernels gave relative errors of 0.6 at 49-63 columns with up to
// 32 rows of A, where the rows are now multiplied from a row-major copy; the emulation and the AVX512_BF16 kernels
// never did.
TEST(MatmulEmulation, NarrowColumnMajorBFloat16ProductsOnEveryIsa) {
  Generator gen(53);
  for (int64_t m : {1, 22, 32, 33}) {
    for (int64_t n = 1; n <= 130; ++n) {
      SCOPED_TRACE(testing::Message() << m << " x 32 x " << n);
      const Tensor a = randn({m, 32}, DType::Float32, &gen).to(DType::BFloat16);
      const Tensor bt = randn({n, 32}, DType::Float32, &gen).to(DType::BFloat16);
      const Tensor a64 = a.double_(), b64 = bt.t().double_();
      ASSERT_NO_FATAL_FAILURE(expect_rounded_once(mm(a, bt.t()), mm(a64, b64), mm(abs(a64), abs(b64))));
    }
  }
}

// The threads share the work evenly: the busiest does at most 1/8 more than its share. (Before, 768 rows in tiles of
// at most 341 went 2 + 1 to two threads, 682 rows against 86, and the O1 step of the default GPT under the AVX2 cap
// ran at 0.62-0.70x O0's speed while its CPU time was O0's: the idle thread costs no CPU time.)
TEST(MatmulEmulation, ThreadsShareTheTilesEvenly) {
  struct Shape {
    int64_t B, M, K, N;
  };
  // The default GPT's products (B12 x T64 = 768 rows, width 128, 4x MLP): forward, input and weight gradients, then
  // a batched one, a tall skinny one, and operands of several tiles in every dimension.
  const Shape shapes[] = {{1, 768, 128, 384}, {1, 768, 384, 128}, {1, 128, 768, 384}, {1, 768, 128, 512},
                          {1, 768, 512, 128}, {1, 512, 768, 128}, {1, 768, 128, 100}, {1, 100, 768, 128},
                          {12, 64, 32, 64},   {3, 70, 90, 50},    {1, 4096, 64, 64},  {1, 600, 1100, 700}};
  for (int threads : {2, 3, 4})
    for (const Shape& s : shapes) {
      const std::vector<int64_t> work = kernels::emulated_matmul_work(s.B, s.M, s.K, s.N, threads);
      int64_t total = 0;
      for (int64_t w : work) total += w;
      ASSERT_EQ(total, s.B * s.M * s.K * s.N) << "every product once";
      const double share = static_cast<double>(total) / threads;
      EXPECT_LE(static_cast<double>(*std::max_element(work.begin(), work.end())), 1.125 * share)
          << threads << " threads, (" << s.B << ", " << s.M << ", " << s.K << ") x (" << s.K << ", " << s.N << ")";
    }
}

}  // namespace
}  // namespace castor
