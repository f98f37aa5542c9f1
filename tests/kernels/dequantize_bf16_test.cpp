// The fused bfloat16 dequantizers (src/kernels/cpu/dequantize_bf16.cpp), every row this CPU runs (AVX512_BF16,
// AVX-512, AVX2 and the scalar reference on an AVX-512 machine), against the dequantize-then-round path: the type's
// float32 dequantizer (checked against ggml in quant_blocks_test.cpp) and float_to_bf16_bits, bit for bit, on
// quantized random matrices, random bytes, the extreme codes, and every block's scale set to zero, the float16
// denormals, +-infinity, the largest float16 and NaNs with payloads. And quant::dequantize_tile_bf16 for every block
// type (fused or through float32) against dequantize_tile rounded, on whole rows and on a tile of columns.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "castor/convert.h"
#include "castor/half.h"
#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "core/convert_kernels.h"
#include "kernels/cpu/dequantize_bf16.h"
#include "test_util.h"

namespace castor {
namespace {

using quant::BlockType;

std::vector<uint16_t> rounded(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16_bits(x[i]);
  return y;
}

::testing::AssertionResult same_bits(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << "value " << i << ": bits " << std::hex << got[i] << " vs " << want[i];
  return ::testing::AssertionSuccess();
}

TEST(DequantizeBf16, EveryKernelEqualsDequantizeThenRound) {
  std::mt19937 rng(46);
  Generator gen(46);
  int ran = 0;
  for (const kernels::DequantizeBf16Kernel& k : kernels::dequantize_bf16_kernels()) {
    SCOPED_TRACE(std::string(quant::block_type(k.type).name) + " " + k.isa);
    if (!detail::isa_enabled(k.isa)) {
      std::printf("  (%s %s: not run, this CPU's widest enabled set is %s)\n", quant::block_type(k.type).name, k.isa,
                  conversion_isa());
      continue;
    }
    ++ran;
    const quant::BlockTypeInfo& t = quant::block_type(k.type);
    const int64_t rows = 3, cols = 4096, n = rows * cols, bytes = quant::row_bytes(t.id, n);
    std::vector<std::vector<uint8_t>> cases;
    const Tensor w = randn({rows, cols}, DType::Float32, &gen) * 0.02;
    const quant::QuantizedMatrix q = quant::quantize_matrix(w.data<float>(), rows, cols, t.id);
    cases.emplace_back(q.data.data<uint8_t>(), q.data.data<uint8_t>() + bytes);
    std::vector<uint8_t> noise(static_cast<size_t>(bytes));
    for (uint8_t& b : noise) b = static_cast<uint8_t>(rng());
    cases.push_back(noise);
    ASSERT_EQ(t.id, BlockType::Q8_0) << "the edge cases below know q8_0's layout only";
    std::vector<uint8_t> extreme = noise;  // codes -128, 127, 0 and -1 over every scale the noise drew
    for (int64_t b = 0; b < bytes; b += t.bytes)
      for (int j = 0; j < 32; ++j)
        extreme[static_cast<size_t>(b + 2 + j)] = std::vector<uint8_t>{0x80, 0x7f, 0, 0xff}[j % 4];
    cases.push_back(extreme);
    for (uint16_t scale :
         {0x0000, 0x8000, 0x0001, 0x03ff, 0x8001, 0x0400, 0x7c00, 0xfc00, 0x7bff, 0x7e00, 0x7d01, 0xfe3f, 0x7c01}) {
      std::vector<uint8_t> blocks = noise;
      for (int64_t b = 0; b < bytes; b += t.bytes) std::memcpy(&blocks[static_cast<size_t>(b)], &scale, 2);
      cases.push_back(blocks);
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE("case " + std::to_string(c));
      std::vector<float> f(static_cast<size_t>(n));
      std::vector<uint16_t> got(static_cast<size_t>(n), 0x1234);
      t.dequantize(cases[c].data(), f.data(), n);
      k.run(cases[c].data(), got.data(), n);
      ASSERT_TRUE(same_bits(got, rounded(f)));
      std::fill(got.begin(), got.end(), 0x1234);
      k.run(cases[c].data(), got.data(), t.block);  // one block: nothing past it written
      ASSERT_EQ(got[static_cast<size_t>(t.block)], 0x1234);
    }
  }
  EXPECT_GE(ran, 1);
}

TEST(DequantizeBf16, TilesEqualDequantizeTileRounded) {
  Generator gen(7);
  for (const quant::BlockTypeInfo& t : quant::block_types())
    for (bool dq : {false, true}) {
      if (dq && t.id != BlockType::NF4) continue;
      SCOPED_TRACE(std::string(t.name) + (dq ? " double" : ""));
      const int64_t rows = 5, cols = 2048, block = std::max<int64_t>(t.block, 64);
      const Tensor w = randn({rows, cols}, DType::Float32, &gen);
      const quant::QuantizedMatrix q = quant::quantize_matrix(w.data<float>(), rows, cols, t.id, dq);
      for (auto [r0, r1, c0, c1] : {std::array<int64_t, 4>{0, rows, 0, cols}, {1, 4, block, 3 * block}}) {
        const int64_t n = (r1 - r0) * (c1 - c0);
        std::vector<float> f(static_cast<size_t>(n));
        std::vector<uint16_t> got(static_cast<size_t>(n));
        quant::dequantize_tile(q, r0, r1, c0, c1, f.data());
        quant::dequantize_tile_bf16(q, r0, r1, c0, c1, got.data());
        ASSERT_TRUE(same_bits(got, rounded(f)))
            << "rows [" << r0 << ", " << r1 << ") columns [" << c0 << ", " << c1 << ")";
      }
    }
}

}  // namespace
}  // namespace castor
