// Products with a frozen quantized weight: its rows dequantized a tile at a time into the compute dtype, each tile
// multiplied by the dense kernels (oneDNN's float32 / bfloat16 GEMMs), so no dense copy of the weight is ever whole.
#include <algorithm>
#include <vector>

#include "castor/half.h"
#include "castor/quant.h"
#include "core/parallel.h"
#include "core/view.h"
#include "kernels/kernels.h"

namespace castor::quant {

namespace {

constexpr int64_t kTileValues = int64_t{1} << 20;  // values of the weight dequantized at once (4 MB as float32)

// Rows [r0, r0 + n) of w into `tile` (n, K) contiguous, in its dtype.
void dequantize_tile(const QuantizedMatrix& w, int64_t r0, int64_t n, const Tensor& tile, float* scratch) {
  const int64_t K = w.cols;
  const DType dt = tile.dtype();
  float* f = dt == DType::Float32 ? tile.data<float>() : scratch;
  // A row range per thread: whole rows are whole blocks.
  const int64_t rows_per = std::max<int64_t>(1, kBlock / K);
#pragma omp parallel for schedule(static) if (n * K > kParallelGrain)
  for (int64_t r = 0; r < n; r += rows_per) {
    const int64_t e = std::min(n, r + rows_per);
    dequantize_rows(w, r0 + r, r0 + e, f + r * K);
    if (dt == DType::BFloat16) {
      uint16_t* out = static_cast<uint16_t*>(tile.data_ptr());
      for (int64_t i = r * K; i < e * K; ++i) out[i] = float_to_bf16_bits(f[i]);
    } else if (dt == DType::Float16) {
      uint16_t* out = static_cast<uint16_t*>(tile.data_ptr());
      for (int64_t i = r * K; i < e * K; ++i) out[i] = float_to_half_bits(f[i]);
    } else if (dt == DType::Float64) {
      double* out = tile.data<double>();
      for (int64_t i = r * K; i < e * K; ++i) out[i] = f[i];
    }
  }
}

}  // namespace

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
  const int64_t rows = std::clamp<int64_t>(kTileValues / K, 1, N);
  Tensor tile = empty({rows, K}, dt);
  std::vector<float> scratch(dt == DType::Float32 ? 0 : static_cast<size_t>(rows * K));
  // The input gradient sums the tiles' products in float32 (double for float64: dst itself then, and for float32).
  const bool wide = dt == DType::Float32 || dt == DType::Float64;
  const Tensor acc = !transpose_w ? Tensor() : wide ? dst : empty({M, K}, DType::Float32);
  if (transpose_w) kernels::fill(acc, 0.0);
  const Tensor out = transpose_w || rows == N ? Tensor() : empty({M, rows}, dt);
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n = std::min(rows, N - n0);
    dequantize_tile(w, n0, n, tile, scratch.data());
    if (!transpose_w) {
      const Tensor o = n == N ? dst : make_view(out, {M, n}, {n, 1}, out.storage_offset());
      const Tensor b = bias.defined() ? make_view(bias, {n}, {1}, bias.storage_offset() + n0) : Tensor();
      kernels::matmul(x, make_view(tile, {K, n}, {1, K}, tile.storage_offset()), o, b);  // x (M, K) x tile^T (K, n)
      if (n != N) kernels::copy(o, make_view(dst, {M, n}, {N, 1}, dst.storage_offset() + n0));
    } else {
      const Tensor xs = make_view(x, {M, n}, {N, 1}, x.storage_offset() + n0);
      kernels::matmul_add(xs, make_view(tile, {n, K}, {K, 1}, tile.storage_offset()),
                          acc);  // x[:, n0:] (M, n) x tile (n, K)
    }
  }
  if (transpose_w && !wide) kernels::copy(acc, dst);
}

}  // namespace castor::quant
