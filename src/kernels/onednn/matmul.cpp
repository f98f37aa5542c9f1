// Matrix products on oneDNN (float32, bfloat16) with cached primitives; float16 (and bfloat16 where oneDNN has no
// kernel for it) emulated on oneDNN's float32 GEMM a tile at a time.
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "castor/convert.h"
#include "kernels/kernels.h"
#include "kernels/onednn/fallback.h"
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

struct MatmulKey {
  int64_t dt;  // a memory::data_type; int64 so that the key has no padding bytes
  int64_t dims[4];        // B, M, N, K
  int64_t a_strides[3], b_strides[3];
  int64_t bias;  // 1: a bias (N) of the dtype, added before the rounding
};

memory::desc bias_desc(const MatmulKey& k) {
  return memory::desc({1, 1, k.dims[2]}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
}

// nullptr when oneDNN has no implementation for this dtype on this CPU (e.g. bf16 without AVX-512).
std::unique_ptr<dnnl::matmul> build(const MatmulKey& k) {
  const int64_t B = k.dims[0], M = k.dims[1], N = k.dims[2], K = k.dims[3];
  memory::desc a({B, M, K}, static_cast<memory::data_type>(k.dt), {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc b({B, K, N}, static_cast<memory::data_type>(k.dt), {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc c({B, M, N}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
  std::unique_ptr<dnnl::matmul> prim;
  try {
    const dnnl::matmul::desc d = k.bias ? dnnl::matmul::desc(a, b, bias_desc(k), c) : dnnl::matmul::desc(a, b, c);
    dnnl::matmul::primitive_desc pd(d, engine());
    prim = std::make_unique<dnnl::matmul>(pd);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return prim;
}

const dnnl::matmul* cached_matmul(const MatmulKey& k) {
  static PrimitiveCache<MatmulKey, dnnl::matmul> cache;
  return cache.get(k, build);
}

// (B, M, K) view metadata of a 2-D or 3-D tensor.
void batch_strides(const Tensor& t, int64_t out[3]) {
  if (t.dim() == 2) {
    out[0] = t.size(0) * t.size(1);
    out[1] = t.stride(0);
    out[2] = t.stride(1);
  } else {
    out[0] = t.stride(0);
    out[1] = t.stride(1);
    out[2] = t.stride(2);
  }
}

bool run_onednn(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  MatmulKey k{};
  k.dt = static_cast<int64_t>(to_dnnl(a.dtype()));
  k.bias = bias.defined();
  const int64_t B = a.dim() == 3 ? a.size(0) : 1;
  k.dims[0] = B;
  k.dims[1] = a.size(-2);
  k.dims[2] = b.size(-1);
  k.dims[3] = a.size(-1);
  batch_strides(a, k.a_strides);
  batch_strides(b, k.b_strides);
  const dnnl::matmul* prim = cached_matmul(k);
  if (!prim) return false;
  memory::desc ad({B, k.dims[1], k.dims[3]}, static_cast<memory::data_type>(k.dt), {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc bd({B, k.dims[3], k.dims[2]}, static_cast<memory::data_type>(k.dt), {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc cd({B, k.dims[1], k.dims[2]}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
  memory am(ad, engine(), a.data_ptr()), bm(bd, engine(), b.data_ptr()), cm(cd, engine(), dst.data_ptr());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (k.bias) args.insert({DNNL_ARG_BIAS, memory(bias_desc(k), engine(), bias.data_ptr())});
  prim->execute(stream(), args);
  stream().wait();
  return true;
}

// The emulation's blocks: the output is done in panels of at most kPanelFloats float32 values (1 MiB), each summed
// over depth chunks of at most kChunkK, with the right operand's chunk widened once per panel and chunk and shared by
// the threads, each of which widens the left operand a task of rows at a time. Its scratch stays near 2-3 MiB whatever
// the operands' size, where whole float32 copies of the operands and the result would cost more memory than 16-bit
// activations save.
constexpr int64_t kPanelFloats = 1 << 18;
constexpr int64_t kChunkK = 512;
constexpr int64_t kMinSide = 64;
constexpr int64_t kMaxTaskRows = 64;

// The block [r0, r0 + rows) x [c0, c0 + cols) of matrix `batch` of a 16-bit t (B, R, C) as runs of adjacent elements:
// rows of `cols` values when t's last dim is dense (sgemm's 'N'), else columns of `rows` values ('T').
struct Block {
  const char* base;
  DType dtype;
  int64_t ld;        // elements from one run to the next in t
  int64_t runs, len;  // the dense float32 copy is runs x len, row-major
  char trans;
};

Block block_of(const Tensor& t, int64_t batch, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  int64_t st[3];
  batch_strides(t, st);
  const char* base =
      static_cast<const char*>(t.data_ptr()) + (batch * st[0] + r0 * st[1] + c0 * st[2]) * dtype_size(t.dtype());
  if (st[2] == 1) return {base, t.dtype(), st[1], rows, cols, 'N'};
  return {base, t.dtype(), st[2], cols, rows, 'T'};
}

// Widens runs [q0, q1) of a block into its dense float32 copy `dst`.
void widen_runs(const Block& b, int64_t q0, int64_t q1, float* dst) {
  const int64_t size = dtype_size(b.dtype);
  for (int64_t q = q0; q < q1; ++q)
    convert(b.base + q * b.ld * size, b.dtype, dst + q * b.len, DType::Float32, static_cast<size_t>(b.len));
}

// dst (B, M, N) = a (B, M, K) x b (B, K, N) [+ bias (N)] for 16-bit operands without a oneDNN kernel: each output
// panel is summed in float32 by oneDNN's sgemm over exactly widened float32 blocks of the operands, the bias is added,
// and the panel is rounded once into dst (the numerics of 16-bit tensor cores). One parallel region per panel and
// chunk: sgemm runs on one thread inside it, on a task of rows.
void matmul_emulated(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  const int64_t B = a.dim() == 3 ? a.size(0) : 1, M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t kb = std::min(K, kChunkK);
  const int64_t nb = std::min(N, std::max(kMinSide, kPanelFloats / kb));
  const int64_t mb = std::min(M, std::max(kMinSide, kPanelFloats / nb));
  const int threads = omp_get_max_threads();
  const int64_t task_rows = std::clamp<int64_t>((mb + threads - 1) / threads, 1, kMaxTaskRows);
  const Tensor b_block = empty({kb * nb}, DType::Float32), panel = empty({mb * nb}, DType::Float32);
  const Tensor a_blocks = empty({threads * task_rows * kb}, DType::Float32), bias_f = widen(bias);
  float *bt = b_block.data<float>(), *ct = panel.data<float>();
  const float* bias_p = bias_f.defined() ? bias_f.data<float>() : nullptr;
  const int64_t out_size = dtype_size(dst.dtype());
  for (int64_t batch = 0; batch < B; ++batch)
    for (int64_t m0 = 0; m0 < M; m0 += mb)
      for (int64_t n0 = 0; n0 < N; n0 += nb)
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
          const int64_t m = std::min(mb, M - m0), n = std::min(nb, N - n0), k = std::min(kb, K - k0);
          const bool last = k0 + kb >= K;
          const Block bb = block_of(b, batch, k0, k, n0, n);
          const int64_t tasks = (m + task_rows - 1) / task_rows;
#pragma omp parallel
          {
#pragma omp for schedule(static)
            for (int64_t q = 0; q < bb.runs; ++q) widen_runs(bb, q, q + 1, bt);
            float* at = a_blocks.data<float>() + omp_get_thread_num() * task_rows * kb;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tasks; ++t) {
              const int64_t r0 = t * task_rows, rows = std::min(task_rows, m - r0);
              const Block ab = block_of(a, batch, m0 + r0, rows, k0, k);
              widen_runs(ab, 0, ab.runs, at);
              float* c = ct + r0 * n;
              dnnl::sgemm(ab.trans, bb.trans, rows, n, k, 1.0f, at, ab.len, bt, bb.len, k0 == 0 ? 0.0f : 1.0f, c, n);
              if (!last) continue;
              char* out = static_cast<char*>(dst.data_ptr()) + ((batch * M + m0 + r0) * N + n0) * out_size;
              for (int64_t r = 0; r < rows; ++r) {
                float* row = c + r * n;
                if (bias_p)
                  for (int64_t j = 0; j < n; ++j) row[j] += bias_p[n0 + j];
                convert(row, DType::Float32, out + r * N * out_size, dst.dtype(), static_cast<size_t>(n));
              }
            }
          }
        }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  CASTOR_ASSERT(a.dtype() == b.dtype() && a.dtype() == dst.dtype() && dst.is_contiguous(), "matmul kernel on ",
                a.describe(), ", ", b.describe(), " -> ", dst.describe());
  CASTOR_ASSERT(!bias.defined() || (bias.dtype() == dst.dtype() && bias.is_contiguous() && bias.dim() == 1 &&
                                    bias.size(0) == dst.size(-1)),
                "matmul kernel bias ", bias.describe(), " for ", dst.describe());
  if (dst.numel() == 0) return;
  if (a.size(-1) == 0 || a.dtype() == DType::Float64) return matmul_ref(a, b, dst, bias);
  // oneDNN reads inner-most strides of 1 in one of the last two dims; anything else is copied first.
  auto usable = [](const Tensor& t) { return t.stride(-1) == 1 || t.stride(-2) == 1; };
  const Tensor x = usable(a) ? a : a.contiguous(), y = usable(b) ? b : b.contiguous();
  try {
    if (a.dtype() != DType::Float16 && run_onednn(x, y, dst, bias)) return;
    CASTOR_ASSERT(is_16bit_float(a.dtype()), "no matmul kernel for ", dtype_name(a.dtype()));
    matmul_emulated(x, y, dst, bias);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("matmul: oneDNN could not run ", a.describe(), " x ", b.describe(), ": ", e.what()));
  }
}

}  // namespace castor::kernels
