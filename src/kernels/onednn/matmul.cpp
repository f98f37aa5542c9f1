// Matrix products on oneDNN (float32, bfloat16) with cached primitives; float16 (and bfloat16 on CPUs without bf16
// dot-product units) emulated on oneDNN's float32 GEMM a tile at a time.
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "castor/backends.h"
#include "castor/convert.h"
#include "kernels/kernels.h"
#include "kernels/onednn/fallback.h"
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

struct MatmulKey {
  int64_t dt;       // the operands' memory::data_type; int64 so that the key has no padding bytes
  int64_t dst_dt;   // the destination's: dt, or f32 for 16-bit operands
  int64_t dims[4];  // B, M, N, K
  int64_t a_strides[3], b_strides[3];
  int64_t bias;        // 1: a bias (N) of the dtype, added before the rounding
  int64_t accumulate;  // 1: the product is added to what the destination holds (a sum post-op)
};

memory::desc bias_desc(const MatmulKey& k) {
  return memory::desc({1, 1, k.dims[2]}, static_cast<memory::data_type>(k.dt), memory::format_tag::abc);
}

// nullptr when oneDNN has no implementation for this dtype on this CPU (e.g. bf16 without AVX-512).
std::unique_ptr<dnnl::matmul> build(const MatmulKey& k) {
  const int64_t B = k.dims[0], M = k.dims[1], N = k.dims[2], K = k.dims[3];
  memory::desc a({B, M, K}, static_cast<memory::data_type>(k.dt), {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc b({B, K, N}, static_cast<memory::data_type>(k.dt), {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc c({B, M, N}, static_cast<memory::data_type>(k.dst_dt), memory::format_tag::abc);
  std::unique_ptr<dnnl::matmul> prim;
  try {
    const dnnl::matmul::desc d = k.bias ? dnnl::matmul::desc(a, b, bias_desc(k), c) : dnnl::matmul::desc(a, b, c);
    dnnl::primitive_attr attr;
    if (k.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(d, attr, engine());
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

// Whether b is a column-major (K-major, a Linear's (N, K) weight seen as (K, N)) bfloat16 right operand of fewer than 64
// columns on AMX. oneDNN 2.6's AMX bf16 matmul gives wrong products for such operands of 49-63 columns when A has at
// most 32 rows (a shape scan on Sapphire Rapids: relative errors of 0.6; MatmulEmulation.
// NarrowColumnMajorBFloat16ProductsOnEveryIsa); such a b is small, so it is multiplied from a row-major copy.
bool amx_narrow_column_major(const Tensor& b) {
  static const bool amx = [] {
    const char* units = backends::bf16_dot_units();
    return units && std::string_view(units) == "amx_bf16";
  }();
  int64_t st[3];
  batch_strides(b, st);
  return amx && b.dtype() == DType::BFloat16 && b.size(-1) < 64 && b.size(-1) > 1 && st[1] == 1;
}

bool run_onednn(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias, bool accumulate = false) {
  if (amx_narrow_column_major(b)) return run_onednn(a, b.contiguous(), dst, bias, accumulate);
  MatmulKey k{};
  k.dt = static_cast<int64_t>(to_dnnl(a.dtype()));
  k.dst_dt = static_cast<int64_t>(to_dnnl(dst.dtype()));
  k.bias = bias.defined();
  k.accumulate = accumulate;
  const int64_t B = a.dim() == 3 ? a.size(0) : 1;
  k.dims[0] = B;
  k.dims[1] = a.size(-2);
  k.dims[2] = b.size(-1);
  k.dims[3] = a.size(-1);
  batch_strides(a, k.a_strides);
  batch_strides(b, k.b_strides);
  const dnnl::matmul* prim = cached_matmul(k);
  if (!prim) return false;
  memory::desc ad({B, k.dims[1], k.dims[3]}, static_cast<memory::data_type>(k.dt),
                  {k.a_strides[0], k.a_strides[1], k.a_strides[2]});
  memory::desc bd({B, k.dims[3], k.dims[2]}, static_cast<memory::data_type>(k.dt),
                  {k.b_strides[0], k.b_strides[1], k.b_strides[2]});
  memory::desc cd({B, k.dims[1], k.dims[2]}, static_cast<memory::data_type>(k.dst_dt), memory::format_tag::abc);
  memory am(ad, engine(), a.data_ptr()), bm(bd, engine(), b.data_ptr()), cm(cd, engine(), dst.data_ptr());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (k.bias) args.insert({DNNL_ARG_BIAS, memory(bias_desc(k), engine(), bias.data_ptr())});
  prim->execute(stream(), args);
  stream().wait();
  return true;
}

// The emulation's tiles: the output is done in tiles of at most mb x nb, each summed over depth chunks of at most
// kChunkK, every tile by one thread, which widens the tile's blocks of both operands into its own float32 scratch
// (at most kTileFloats values each for the left block, the right block and the tile's sum: 1.5 MiB a thread at
// most), runs oneDNN's sgemm on them on one thread and rounds the tile once. Tiles go to the threads in contiguous
// runs ordered so that a thread's next tile usually shares the right operand's block, which it then widens only
// once; one parallel region a call and no barrier inside it (each one a stall on a loaded machine). The scratch stays
// near 2-3 MiB whatever the operands' size, where whole float32 copies of the operands and the result would cost more
// memory than 16-bit activations save.
constexpr int64_t kTileFloats = 1 << 17;
constexpr int64_t kChunkK = 512;
constexpr int64_t kMinSide = 64;

// The block [r0, r0 + rows) x [c0, c0 + cols) of matrix `batch` of a 16-bit t (B, R, C) as runs of adjacent elements:
// rows of `cols` values when t's last dim is dense (sgemm's 'N'), else columns of `rows` values ('T').
struct Block {
  const char* base;
  DType dtype;
  int64_t ld;         // elements from one run to the next in t
  int64_t runs, len;  // the dense float32 copy is runs x len, row-major
  char trans;
};

Block block_of(const Tensor& t, int64_t batch, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  int64_t st[3];
  batch_strides(t, st);
  const char* base = static_cast<const char*>(t.data_ptr()) +
                     (batch * st[0] + r0 * st[1] + c0 * st[2]) * dtype_size(t.dtype());
  if (st[2] == 1) return {base, t.dtype(), st[1], rows, cols, 'N'};
  return {base, t.dtype(), st[2], cols, rows, 'T'};
}

// Widens a block into its dense float32 copy `dst` (on the calling thread; in one pass when its runs are adjacent).
void widen_block(const Block& b, float* dst) {
  const int64_t size = dtype_size(b.dtype);
  if (b.ld == b.len) return convert_serial(b.base, b.dtype, dst, DType::Float32, static_cast<size_t>(b.runs * b.len));
  for (int64_t q = 0; q < b.runs; ++q)
    convert_serial(b.base + q * b.ld * size, b.dtype, dst + q * b.len, DType::Float32, static_cast<size_t>(b.len));
}

// The tiling of dst (B, M, N) = a (B, M, K) x b (B, K, N): tile i is (batch, column block, row block), row blocks
// fastest, so that consecutive tiles share b's block.
struct Tiling {
  int64_t B, M, K, N, mb, nb, kb, m_tiles, n_tiles;
  int64_t count() const { return B * n_tiles * m_tiles; }
};

Tiling tiling(int64_t B, int64_t M, int64_t K, int64_t N, int threads) {
  Tiling g{};
  g.B = B, g.M = M, g.K = K, g.N = N;
  g.kb = std::min(g.K, kChunkK);
  // Column blocks of equal width, as few as the scratch allows.
  g.n_tiles = (g.N + std::max(kMinSide, kTileFloats / g.kb) - 1) / std::max(kMinSide, kTileFloats / g.kb);
  g.nb = (g.N + g.n_tiles - 1) / g.n_tiles;
  // Row blocks: as few as the scratch allows, then as many more as make the tile count a multiple of the threads
  // (each thread's contiguous run of tiles the same work: one thread with two thirds of the rows leaves the other
  // idle), of equal height. Rows run fastest, so a thread's run mostly shares b's block, widened about once.
  const int64_t rows_cap = std::max(kMinSide, kTileFloats / std::max(g.nb, g.kb));
  const int64_t columns = g.B * g.n_tiles, step = threads / std::gcd<int64_t>(columns, threads);
  g.m_tiles = std::min(g.M, ((g.M + rows_cap - 1) / rows_cap + step - 1) / step * step);
  g.mb = (g.M + g.m_tiles - 1) / g.m_tiles;
  g.m_tiles = (g.M + g.mb - 1) / g.mb;
  return g;
}

// One thread's float32 scratch: the left block, the right block (and which one it holds), the tile's sum.
struct Scratch {
  float *a, *b, *c;
  int64_t b_batch = -1, b_n0 = -1;
};

// Tile `i`: its float32 sum over the depth chunks (sgemm on the widened blocks), plus the bias, rounded once into dst.
void run_tile(const Tiling& g, int64_t i, const Tensor& a, const Tensor& b, const Tensor& dst, const float* bias,
              Scratch& s) {
  const int64_t batch = i / (g.n_tiles * g.m_tiles), n0 = (i / g.m_tiles) % g.n_tiles * g.nb, m0 = i % g.m_tiles * g.mb;
  const int64_t m = std::min(g.mb, g.M - m0), n = std::min(g.nb, g.N - n0);
  for (int64_t k0 = 0; k0 < g.K; k0 += g.kb) {
    const int64_t k = std::min(g.kb, g.K - k0);
    const Block ab = block_of(a, batch, m0, m, k0, k), bb = block_of(b, batch, k0, k, n0, n);
    // With a single depth chunk the right block depends on the batch and columns only.
    const bool held = g.kb == g.K && s.b_batch == batch && s.b_n0 == n0;
    if (!held) widen_block(bb, s.b);
    s.b_batch = g.kb == g.K ? batch : -1, s.b_n0 = n0;
    widen_block(ab, s.a);
    dnnl::sgemm(ab.trans, bb.trans, m, n, k, 1.0f, s.a, ab.len, s.b, bb.len, k0 == 0 ? 0.0f : 1.0f, s.c, n);
  }
  if (bias)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) s.c[r * n + j] += bias[n0 + j];
  const int64_t out_size = dtype_size(dst.dtype());
  char* out = static_cast<char*>(dst.data_ptr()) + ((batch * g.M + m0) * g.N + n0) * out_size;
  if (n == g.N) return convert_serial(s.c, DType::Float32, out, dst.dtype(), static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r)
    convert_serial(s.c + r * n, DType::Float32, out + r * g.N * out_size, dst.dtype(), static_cast<size_t>(n));
}

// dst (B, M, N) = a (B, M, K) x b (B, K, N) [+ bias (N)] for 16-bit operands without a oneDNN kernel: each output
// tile is summed in float32 by oneDNN's sgemm over exactly widened float32 blocks of the operands, the bias is added,
// and the tile is rounded once into dst (the numerics of 16-bit tensor cores).
void matmul_emulated(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  const int threads = omp_get_max_threads();
  const Tiling g = tiling(a.dim() == 3 ? a.size(0) : 1, a.size(-2), a.size(-1), b.size(-1), threads);
  const int64_t per_thread = g.mb * g.kb + g.kb * g.nb + g.mb * g.nb;
  const Tensor scratch = empty({threads * per_thread}, DType::Float32), bias_f = widen(bias);
  const float* bias_p = bias_f.defined() ? bias_f.data<float>() : nullptr;
  const int64_t tiles = g.count();
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, tiles)))
  {
    float* own = scratch.data<float>() + omp_get_thread_num() * per_thread;
    Scratch s{own, own + g.mb * g.kb, own + g.mb * g.kb + g.kb * g.nb};
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < tiles; ++i) run_tile(g, i, a, b, dst, bias_p, s);
  }
}

// oneDNN reads inner-most strides of 1 in one of the last two dims; anything else is copied first.
Tensor usable(const Tensor& t) { return t.stride(-1) == 1 || t.stride(-2) == 1 ? t : t.contiguous(); }

}  // namespace

std::vector<int64_t> emulated_matmul_work(int64_t B, int64_t M, int64_t K, int64_t N, int threads) {
  const Tiling g = tiling(B, M, K, N, threads);
  std::vector<int64_t> work(static_cast<size_t>(threads), 0);
  const int64_t tiles = g.count(), used = std::min<int64_t>(threads, tiles);
  for (int64_t t = 0; t < used; ++t)  // omp's static schedule: contiguous runs, the first tiles % used one longer
    for (int64_t i = t * (tiles / used) + std::min(t, tiles % used), e = i + tiles / used + (t < tiles % used ? 1 : 0);
         i < e; ++i) {
      const int64_t n0 = (i / g.m_tiles) % g.n_tiles * g.nb, m0 = i % g.m_tiles * g.mb;
      work[static_cast<size_t>(t)] += std::min(g.mb, M - m0) * std::min(g.nb, N - n0) * K;
    }
  return work;
}

void matmul(const Tensor& a, const Tensor& b, const Tensor& dst, const Tensor& bias) {
  CASTOR_ASSERT(a.dtype() == b.dtype() && a.dtype() == dst.dtype() && dst.is_contiguous(), "matmul kernel on ",
                a.describe(), ", ", b.describe(), " -> ", dst.describe());
  CASTOR_ASSERT(!bias.defined() || (bias.dtype() == dst.dtype() && bias.is_contiguous() && bias.dim() == 1 &&
                                    bias.size(0) == dst.size(-1)),
                "matmul kernel bias ", bias.describe(), " for ", dst.describe());
  if (dst.numel() == 0) return;
  if (a.size(-1) == 0 || a.dtype() == DType::Float64) return matmul_ref(a, b, dst, bias);
  const Tensor x = usable(a), y = usable(b);
  try {
    if (native_products(a.dtype()) && run_onednn(x, y, dst, bias)) return;
    CASTOR_ASSERT(is_16bit_float(a.dtype()), "no matmul kernel for ", dtype_name(a.dtype()));
    matmul_emulated(x, y, dst, bias);
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("matmul: oneDNN could not run ", a.describe(), " x ", b.describe(), ": ", e.what()));
  }
}

void matmul_add(const Tensor& a, const Tensor& b, const Tensor& dst) {
  CASTOR_ASSERT(a.dtype() == b.dtype() && dst.is_contiguous() &&
                    (dst.dtype() == a.dtype() || (is_16bit_float(a.dtype()) && dst.dtype() == DType::Float32)),
                "matmul_add kernel on ", a.describe(), ", ", b.describe(), " -> ", dst.describe());
  if (dst.numel() == 0 || a.size(-1) == 0) return;
  const Tensor x = usable(a), y = usable(b);
  try {
    if (dst.dtype() == DType::Float32) {
      if (native_products(a.dtype()) && run_onednn(x, y, dst, Tensor(), /*accumulate=*/true)) return;
      // Exact float32 copies of 16-bit operands without a oneDNN kernel of their own.
      const bool f32 = a.dtype() == DType::Float32;
      if (run_onednn(f32 ? x : widen(x), f32 ? y : widen(y), dst, Tensor(), /*accumulate=*/true)) return;
    }
  } catch (const dnnl::error& e) {
    throw Error(detail::cat("matmul: oneDNN could not run ", a.describe(), " x ", b.describe(), ": ", e.what()));
  }
  CASTOR_ASSERT(dst.dtype() == DType::Float64, "no matmul_add kernel for ", dst.describe());
  const Tensor part = empty(dst.shape(), DType::Float64);
  matmul_ref(x, y, part);
  double* d = dst.data<double>();
  const double* p = part.data<double>();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += p[i];
}

}  // namespace castor::kernels
