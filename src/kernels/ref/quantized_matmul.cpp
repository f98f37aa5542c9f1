// Products with a frozen quantized weight: tiles of it (its rows forward, its columns backward) dequantized in turn into
// the compute dtype, each multiplied by the dense kernels (oneDNN's float32 / bfloat16 GEMMs), so no dense copy of the
// weight is ever whole.
#include <algorithm>
#include <numeric>
#include <vector>

#include "castor/convert.h"
#include "castor/quant.h"
#include "core/parallel.h"
#include "core/view.h"
#include "kernels/kernels.h"

namespace castor::quant {

namespace {

// Values of the weight dequantized at once (32 MB as bfloat16): each matrix of a TinyLlama layer in one tile, of a
// Llama-3-8B layer in at most four, since oneDNN's products run faster the wider they are (a (512, 5632) x (5632, 128)
// tile's product trails one over the whole width by a fifth on AMX).
constexpr int64_t kTileValues = int64_t{1} << 24;

}  // namespace

void dequantize_tile_to(const QuantizedMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const Tensor& tile) {
  const int64_t n = r1 - r0, K = c1 - c0;
  const DType dt = tile.dtype();
  CASTOR_ASSERT(is_floating(dt) && tile.is_contiguous() && tile.numel() == n * K,
                "dequantize_tile_to: ", tile.describe(), " for rows [", r0, ", ", r1, ") columns [", c0, ", ", c1, ")");
  std::vector<float> scratch(dt == DType::Float32 || dt == DType::BFloat16 ? 0 : static_cast<size_t>(n * K));
  // A row range per thread: whole rows are whole blocks.
  const int64_t rows_per = std::max<int64_t>(1, kBlock / K);
#pragma omp parallel for schedule(static) if (n * K > kParallelGrain)
  for (int64_t r = 0; r < n; r += rows_per) {
    const int64_t e = std::min(n, r + rows_per);
    if (dt == DType::Float32) {
      dequantize_tile(w, r0 + r, r0 + e, c0, c1, tile.data<float>() + r * K);
    } else if (dt == DType::BFloat16) {
      dequantize_tile_bf16(w, r0 + r, r0 + e, c0, c1, static_cast<uint16_t*>(tile.data_ptr()) + r * K);
    } else {  // rounded once (exactly widened for float64) by the bulk converters
      dequantize_tile(w, r0 + r, r0 + e, c0, c1, scratch.data() + r * K);
      convert_serial(scratch.data() + r * K, DType::Float32,
                     static_cast<char*>(tile.data_ptr()) + r * K * dtype_size(dt), dt,
                     static_cast<size_t>((e - r) * K));
    }
  }
}

void quantized_matmul(const Tensor& x, const QuantizedMatrix& w, bool transpose_w, const Tensor& dst,
                      const Tensor& bias) {
  const DType dt = x.dtype();
  CASTOR_ASSERT(is_floating(dt), "quantized_matmul: ", dtype_name(dt));
  CASTOR_ASSERT(x.dim() == 2 && x.is_contiguous() && dst.is_contiguous() && dst.dtype() == dt &&
                    (!bias.defined() || (!transpose_w && bias.is_contiguous() && bias.dtype() == dt)),
                "quantized_matmul: operands ", x.describe(), ", ", dst.describe(), ", ", bias.describe());
  const int64_t M = x.size(0), N = w.rows, K = w.cols;
  CASTOR_ASSERT(x.size(1) == (transpose_w ? N : K) && dst.size(0) == M && dst.size(1) == (transpose_w ? K : N),
                "quantized_matmul: ", x.describe(), " and a (", N, ", ", K, ") weight into ", dst.describe());
  // Tiles along the output's columns, so that each output is one product over the whole depth, rounded once: rows of
  // w forward; backward, columns of w (whole blocks of its type, of 64 when they are smaller).
  const int64_t depth = transpose_w ? N : K, width = transpose_w ? K : N;
  const int64_t unit = transpose_w ? std::lcm<int64_t>(block_type(w.type).block, 64) : 1;
  const int64_t step = std::min(width, std::max<int64_t>(1, kTileValues / depth / unit) * unit);
  Tensor tile = empty({depth, step}, dt);  // forward (step, K), backward (N, step): the same count
  const Tensor out = step == width ? Tensor() : empty({M, step}, dt);
  for (int64_t c0 = 0; c0 < width; c0 += step) {
    const int64_t n = std::min(step, width - c0);
    const Tensor o = n == width ? dst : make_view(out, {M, n}, {n, 1}, out.storage_offset());
    if (!transpose_w) {
      const Tensor t = make_view(tile, {n, K}, {K, 1}, tile.storage_offset());
      dequantize_tile_to(w, c0, c0 + n, 0, K, t);
      const Tensor b = bias.defined() ? make_view(bias, {n}, {1}, bias.storage_offset() + c0) : Tensor();
      kernels::matmul(x, t.t(), o, b);  // x (M, K) x tile^T (K, n)
    } else {
      const Tensor t = make_view(tile, {N, n}, {n, 1}, tile.storage_offset());
      dequantize_tile_to(w, 0, N, c0, c0 + n, t);
      kernels::matmul(x, t, o);  // x (M, N) x tile (N, n)
    }
    if (n != width) kernels::copy(o, make_view(dst, {M, n}, {width, 1}, dst.storage_offset() + c0));
  }
}

}  // namespace castor::quant
