// Products with a frozen quantized weight (quant::quantized_matmul), every block type of the table, both directions
// (a Linear's forward x w^T with a bias, and its input gradient x w): against the float64 product of the same inputs
// and the weight's dequantized values (quant::dequantize_rows, checked against ggml and bitsandbytes in
// quant_blocks_test.cpp) rounded to the compute dtype, each bfloat16 output rounded once from a float32 sum (oneDNN's
// bf16 kernels, or the float32 emulation in the IsaCap.* runs); shapes of several tiles each way, with tails, and one
// to a hundred rows. And a tile of the blocks (quant::dequantize_tile) against the whole rows'.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "kernels/rounded_once.h"
#include "test_util.h"

namespace castor {
namespace {

using quant::BlockType;

// A (rows, cols) weight of random values quantized to `type` (NF4 with double quantization when `dq`).
quant::QuantizedMatrix random_blocks(int64_t rows, int64_t cols, BlockType type, bool dq, Generator& gen) {
  const Tensor w = randn({rows, cols}, DType::Float32, &gen);
  return quant::quantize_matrix(w.data<float>(), rows, cols, type, dq);
}

// A tile of the matrix is that tile of its whole rows, bit for bit.
TEST(QuantizedMatmul, TilesAreTheRowsColumns) {
  Generator gen(5);
  for (const quant::BlockTypeInfo& t : quant::block_types())
    for (bool dq : {false, true}) {
      if (dq && t.id != BlockType::NF4) continue;
      SCOPED_TRACE(std::string(t.name) + (dq ? " double" : ""));
      const int64_t rows = 5, cols = 1024, block = std::lcm<int64_t>(t.block, 64);
      const quant::QuantizedMatrix q = random_blocks(rows, cols, t.id, dq, gen);
      std::vector<float> all(rows * cols), tile(3 * block);
      quant::dequantize_rows(q, 0, rows, all.data());
      quant::dequantize_tile(q, 1, 4, 2 * block, 3 * block, tile.data());
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < block; ++c)
          ASSERT_EQ(tile[r * block + c], all[(r + 1) * cols + 2 * block + c]) << r << ", " << c;
    }
}

TEST(QuantizedMatmul, EveryBlockTypeBothDirectionsRoundedOnce) {
  Generator gen(46);
  struct Shape {
    int64_t N, K;
  };
  // 200 x 768: a tail of 8 rows past 64-row blocks, every type; 2112 x 512 (the 32- and 256-value blocks): three
  // packed tiles of rows forward (1024, 1024, 64) and several of columns backward (192, 192, 128 or 256, 256).
  for (const Shape& s : {Shape{200, 768}, Shape{2112, 512}})
    for (const quant::BlockTypeInfo& t : quant::block_types())
      for (bool dq : {false, true}) {
        if ((dq && t.id != BlockType::NF4) || (s.N > 1000 && t.id != BlockType::Q8_0 && t.id != BlockType::Q4_K))
          continue;
        const quant::QuantizedMatrix q = random_blocks(s.N, s.K, t.id, dq, gen);
        Tensor dense = empty({s.N, s.K});
        quant::dequantize_rows(q, 0, s.N, dense.data<float>());
        for (DType dt : {DType::BFloat16, DType::Float32})
          for (int64_t M : {1, 33, 130}) {
            SCOPED_TRACE(
                detail::cat(t.name, dq ? " double " : " ", s.N, " x ", s.K, ", ", M, " rows, ", dtype_name(dt)));
            const Tensor w64 = dense.to(dt).double_();  // (N, K): the values the product multiplies
            const Tensor x = randn({M, s.K}, DType::Float32, &gen).to(dt),
                         bias = randn({s.N}, DType::Float32, &gen).to(dt);
            const Tensor g = randn({M, s.N}, DType::Float32, &gen).to(dt);
            Tensor y = empty({M, s.N}, dt), dx = empty({M, s.K}, dt);
            quant::quantized_matmul(x, q, /*transpose_w=*/false, y, bias);
            quant::quantized_matmul(g, q, /*transpose_w=*/true, dx);
            if (dt == DType::Float32) {  // float32 sums of float32 products: close, not rounded once
              EXPECT_TRUE(test::close(y, add(mm(x.double_(), w64.t()), bias.double_()), 1e-4, 1e-4));
              EXPECT_TRUE(test::close(dx, mm(g.double_(), w64), 1e-4, 1e-4));
              continue;
            }
            const Tensor x64 = x.double_(), g64 = g.double_();
            ASSERT_NO_FATAL_FAILURE(test::expect_rounded_once(y, add(mm(x64, w64.t()), bias.double_()),
                                                              add(mm(abs(x64), abs(w64).t()), abs(bias.double_()))));
            ASSERT_NO_FATAL_FAILURE(test::expect_rounded_once(dx, mm(g64, w64), mm(abs(g64), abs(w64))));
          }
      }
}

}  // namespace
}  // namespace castor
