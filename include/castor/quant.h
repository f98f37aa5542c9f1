// The block types of quantized weights, one table: GGUF's (ggml's ggml-common.h layouts and reference quantizers,
// ggml-quants.c) and bitsandbytes' NF4 (QLoRA), and a frozen matrix stored in one of them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "castor/tensor.h"

namespace castor::quant {

// GGUF's type ids (ggml_type); NF4 is no GGUF type and takes an id outside ggml's range.
enum class BlockType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
  NF4 = 1000,
};

// One row per type. dequantize: n values (a multiple of `block`) from n / block blocks, as ggml's dequantize_row_*
// computes them (bit for bit; NF4 as bitsandbytes' kDequantizeBlockwise). quantize: the reverse, as ggml's
// quantize_row_*_ref (what llama-quantize runs without an importance matrix) or bitsandbytes' kQuantizeBlockwise.
struct BlockTypeInfo {
  BlockType id;
  const char* name;  // ggml's spelling in lower case: "q4_k", "nf4"
  int64_t block;     // values per block
  int64_t bytes;     // bytes per block
  void (*dequantize)(const uint8_t* blocks, float* y, int64_t n);
  void (*quantize)(const float* x, uint8_t* blocks, int64_t n);
};

// The table, in GGUF id order (NF4 last).
std::span<const BlockTypeInfo> block_types();
const BlockTypeInfo& block_type(BlockType id);  // ASSERTs the id is a row
// The row named `name` (case-insensitive), or null.
const BlockTypeInfo* find_block_type(std::string_view name);
// Bytes of n values (a multiple of the type's block; castor::Error otherwise).
int64_t row_bytes(BlockType id, int64_t n);

// NF4 (Dettmers et al. 2023; bitsandbytes functional.py / kernels.cu): 16 codes (the quantiles of N(0, 1) scaled to
// [-1, 1], with an exact 0), blocks of 64 values with an fp32 absmax; a value x takes the code nearest to
// x * (1 / absmax) (the midpoints compared as bitsandbytes' decision tree does: above a midpoint takes the upper
// code). A block here is {float absmax; uint8 codes[32]} (36 bytes), the first value of a pair in the high nibble as
// bitsandbytes packs it.
const float* nf4_codes();  // 16 values

// QLoRA's double quantization of NF4's absmaxes: their mean (float64 sum over float32 values, rounded to float32) is
// subtracted and the rest quantized by the 8-bit signed dynamic map in blocks of 256 (castor's blockwise 8-bit
// quantizer of the 8-bit optimizer: kernels quantize_blockwise); dequantized as code * scale + offset in float32.
struct DoubleQuantized {
  std::vector<uint8_t> codes;  // one per absmax
  std::vector<float> scales;   // one per 256 absmaxes
  float offset = 0;
};
DoubleQuantized double_quantize(const float* absmax, int64_t n);
void double_dequantize(const DoubleQuantized& q, float* absmax);  // q.codes.size() values

// A frozen (rows, cols) matrix stored in blocks along its rows (cols a multiple of the type's block), as a GGUF file
// holds a weight of ne [cols, rows]. `data` is a uint8 tensor (counted by the allocator as tensors are): whole blocks,
// or for NF4 with double quantization only the codes (32 bytes per 64 values), the absmaxes then in `absmax`.
struct QuantizedMatrix {
  BlockType type = BlockType::F32;
  int64_t rows = 0, cols = 0;
  Tensor data;
  std::unique_ptr<DoubleQuantized> absmax;  // NF4 with double quantization only
  int64_t bytes() const;                    // memory held
};

// Quantizes x (rows, cols) row-major. castor::Error when cols is not a multiple of the type's block, or for
// double_quant with a type other than NF4.
QuantizedMatrix quantize_matrix(const float* x, int64_t rows, int64_t cols, BlockType type, bool double_quant = false);
// Rows [r0, r1) of the matrix as float32, (r1 - r0, cols) row-major.
void dequantize_rows(const QuantizedMatrix& q, int64_t r0, int64_t r1, float* out);
// The tile [r0, r1) x [c0, c1) of the matrix as float32, (r1 - r0, c1 - c0) row-major; c0 and c1 whole blocks.
void dequantize_tile(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out);
// The same tile rounded once to bfloat16 (float_to_bf16_bits of each value above, bit for bit): in one pass where the
// type has a fused kernel (q8_0: widened and scaled in registers), else through float32 a few blocks at a time.
void dequantize_tile_bf16(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, uint16_t* out);

// The same tile into `tile` ((r1 - r0, c1 - c0) contiguous, of a float dtype) over the OpenMP threads: float32 and
// bfloat16 (dequantize_tile_bf16) directly, float16 and float64 rounded once (exactly widened) from float32.
void dequantize_tile_to(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const Tensor& tile);

// The one product with a frozen quantized weight w (N, K): tiles of w dequantized in turn into x's dtype (exact
// float32 values, rounded once into bfloat16 / float16, widened for float64) and multiplied by the dense kernels
// (oneDNN's GEMMs), each output one product over the whole depth, rounded once. transpose_w false: dst (M, N) = x (M, K)
// w^T [+ bias (N), added before the rounding as PyTorch's addmm] (a Linear's forward; tiles of w's rows); true: dst
// (M, K) = x (M, N) w (its input gradient; tiles of w's columns, whole blocks). x, dst and bias contiguous, of one
// float dtype.
void quantized_matmul(const Tensor& x, const QuantizedMatrix& w, bool transpose_w, const Tensor& dst,
                      const Tensor& bias = Tensor());

}  // namespace castor::quant
