// Flash-style attention on oneDNN products: a block of query rows against the keys up to its causal limit, the
// scores and probabilities of that block only (per-thread scratch O(block * Tk)), softmax statistics in float32.
#include <dnnl.hpp>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/onednn/onednn.h"
#include "kernels/ref/transformer_util.h"
#include "kernels/transformer.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

constexpr int64_t kBlockRows = 64;  // query rows per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// C (batch, M, N) float32 = A (batch, M, K) x B (batch, K, N) (+ C when accumulating), A and B of type dt with
// any strides (one of rs/cs 1), C rows ldc apart and batches c_bs apart.
struct GemmKey {
  int64_t dt, batch, m, n, k, a_bs, a_rs, a_cs, b_bs, b_rs, b_cs, c_bs, ldc, accumulate;
};

// A cached product with a user-managed scratchpad: threads run the same primitive at once, each with its own
// scratchpad (a library scratchpad may be private to the primitive, which then must not run concurrently).
struct Gemm {
  dnnl::matmul prim;
  size_t scratch_bytes;
  memory::desc a, b, c;
};

std::unique_ptr<Gemm> build_gemm(const GemmKey& g) {
  const auto dt = static_cast<memory::data_type>(g.dt);
  memory::desc a({g.batch, g.m, g.k}, dt, {g.a_bs, g.a_rs, g.a_cs});
  memory::desc b({g.batch, g.k, g.n}, dt, {g.b_bs, g.b_rs, g.b_cs});
  memory::desc c({g.batch, g.m, g.n}, memory::data_type::f32, {g.c_bs, g.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
    return std::make_unique<Gemm>(Gemm{dnnl::matmul(pd), pd.scratchpad_desc().get_size(), a, b, c});
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return nullptr;
}

const Gemm* cached_gemm(const GemmKey& k) {
  static PrimitiveCache<GemmKey, Gemm> cache;
  return cache.get(k, build_gemm);
}

// A batch of matrix operands: element (g, r, c) at p + (g * bs + r * rs + c * cs) * element size.
struct Mat {
  const void* p;
  int64_t rs, cs, bs;
  Mat t() const { return {p, cs, rs, bs}; }
};

// `batch` products C = A B (see GemmKey).
void gemm(memory::data_type dt, int64_t batch, int64_t m, int64_t n, int64_t k, Mat a, Mat b, float* c, int64_t ldc,
          int64_t c_bs, bool accumulate) {
  if (m == 0 || n == 0) return;
  const GemmKey key{
      static_cast<int64_t>(dt), batch, m, n, k, a.bs, a.rs, a.cs, b.bs, b.rs, b.cs, c_bs, ldc, accumulate};
  const Gemm* g = cached_gemm(key);
  CASTOR_ASSERT(g, "attention: oneDNN has no matmul for this shape");
  // This thread's scratchpad and memory objects for the primitive's arguments, made once and re-pointed each call
  // (making them costs more than a small product's arithmetic).
  struct Args {
    memory a, b, c, scratch;
  };
  thread_local std::vector<char> scratchpad;
  thread_local std::unordered_map<const Gemm*, Args> args;
  if (scratchpad.size() < g->scratch_bytes) scratchpad.resize(g->scratch_bytes);
  auto it = args.find(g);
  if (it == args.end()) {
    const memory::desc sd({static_cast<int64_t>(g->scratch_bytes)}, memory::data_type::u8, {1});
    it = args.emplace(g, Args{memory(g->a, engine(), nullptr), memory(g->b, engine(), nullptr),
                              memory(g->c, engine(), nullptr), memory(sd, engine(), nullptr)})
             .first;
  }
  Args& x = it->second;
  x.a.set_data_handle(const_cast<void*>(a.p));
  x.b.set_data_handle(const_cast<void*>(b.p));
  x.c.set_data_handle(c);
  x.scratch.set_data_handle(scratchpad.data());
  g->prim.execute(
      stream(), {{DNNL_ARG_SRC, x.a}, {DNNL_ARG_WEIGHTS, x.b}, {DNNL_ARG_DST, x.c}, {DNNL_ARG_SCRATCHPAD, x.scratch}});
}

// How one call runs its products: on the storage dtype (float32; bfloat16 where the CPU has bf16 dot-product units,
// native_products), or on float32 widenings of the 16-bit values (float16; bfloat16 otherwise). Every conversion
// runs on the calling thread (convert_serial): the kernels are inside their own parallel loops.
struct Plan {
  DType dt;               // storage dtype of q, k, v, dst, diff_dst
  bool widen;             // products on float32 widenings
  memory::data_type mdt;  // the products' input type
  DType pdt;              // the dtype of the rounded probability / dS buffers the products read
};

Plan plan(DType dt) {
  Plan p{dt, false, memory::data_type::f32, DType::Float32};
  if (dt == DType::Float32) return p;
  if (native_products(dt)) {
    p.mdt = memory::data_type::bf16;
    p.pdt = DType::BFloat16;
  } else {
    p.widen = true;
  }
  return p;
}

// A row of `bytes` (a head's D values, a few hundred bytes): 32-byte moves inline, where a memcpy call per row costs
// more than its copying.
inline void copy_row(const char* src, char* dst, size_t bytes) {
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  if (i < bytes) std::memcpy(dst + i, src + i, bytes - i);
}

// The rows of a (B, H, T, D) tensor (contiguous last dim): row r of query head (b, h), which reads head h / rep of
// a k or v (or their gradients) with H / rep heads (grouped-query attention: each shared head read in place).
struct Rows {
  char* base;
  int64_t sb, sh, st, D, rep;
  DType dt;
  size_t es;
  explicit Rows(const Tensor& x, int64_t rep = 1)
      : base(x.defined() ? static_cast<char*>(x.data_ptr()) : nullptr),
        sb(x.defined() ? x.stride(0) : 0),
        sh(x.defined() ? x.stride(1) : 0),
        st(x.defined() ? x.stride(2) : 0),
        D(x.defined() ? x.size(3) : 0),
        rep(rep),
        dt(x.defined() ? x.dtype() : DType::Float32),
        es(x.defined() ? x.element_size() : 0) {}
  char* at(int64_t b, int64_t h, int64_t r) const { return base + (b * sb + h / rep * sh + r * st) * es; }
  // Rows [r0, r0 + n) of heads [h0, h0 + G) as a dense product operand (G, n, D) in buf: copied, or widened to
  // float32. Dense operands get oneDNN's brgemm kernels; strided ones (rows of a (B, T, 3C) projection) its slower
  // packing gemm, and the copy costs O(n D) against the product's O(block n D).
  Mat block(const Plan& pl, int64_t b, int64_t h0, int64_t G, int64_t r0, int64_t n, float* buf) const {
    if (pl.widen) {
      for (int64_t g = 0; g < G; ++g)
        for (int64_t r = 0; r < n; ++r)
          convert_serial(at(b, h0 + g, r0 + r), dt, buf + (g * n + r) * D, DType::Float32, D);
    } else {
      char* out = reinterpret_cast<char*>(buf);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t r = 0; r < n; ++r) copy_row(at(b, h0 + g, r0 + r), out + (g * n + r) * D * es, D * es);
    }
    return {buf, D, 1, n * D};
  }
};

// n float32 values rounded to the dtype the products read: into `dst` (2 bytes each) for bfloat16; for the widened
// float16 path rounded to float16 and back in place (src == dst as float32). Float32 stays as is.
void round_for_product(const Plan& pl, float* src, void* dst, int64_t n) {
  if (pl.pdt == DType::BFloat16) {
    convert_serial(src, DType::Float32, dst, DType::BFloat16, n);
  } else if (pl.dt != DType::Float32) {
    uint16_t tmp[kBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t m = std::min(kBlock, n - j0);
      convert_serial(src + j0, DType::Float32, tmp, pl.dt, m);
      convert_serial(tmp, pl.dt, src + j0, DType::Float32, m);
    }
  }
}

// The keys query row i may see: [0, limit).
int64_t key_limit(bool causal, int64_t i_end, int64_t Tk) { return causal ? std::min(Tk, i_end) : Tk; }

// The row passes of the softmax on 16 lanes where the CPU has AVX-512 (runtime choice; the build's baseline is
// AVX2): the same operations per element in the same order as the AVX2 loops below them (exp16 is exp's polynomial,
// the row sum is added in exp_shifted's 8-lane order), so either gives the same bits. Causal rows only: `valid` keys
// [0, valid) of n are visible, the others -inf as AttentionMask::apply sets them.

CASTOR_AVX512_BEGIN

CASTOR_AVX512 inline __mmask16 lanes(int64_t k) {
  return k >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << std::max<int64_t>(k, 0)) - 1);
}

// Forward: s[j] = e^(s[j] sc - max) (0 past valid); returns the row's max (-inf: every key masked, s untouched
// past the scaling) and its sum in *sum.
CASTOR_AVX512 float softmax_row_avx512(float* s, int64_t n, int64_t valid, float sc, float* sum) {
  const __m512 scv = _mm512_set1_ps(sc), neg_inf = _mm512_set1_ps(kNegInf);
  __m512 mx = neg_inf;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(n - j);
    const __m512 x = _mm512_mask_mov_ps(neg_inf, lanes(valid - j), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), scv));
    _mm512_mask_storeu_ps(s + j, m, x);
    mx = _mm512_max_ps(mx, x);
  }
  const float row_max = vec::hmax16(mx);
  if (row_max == kNegInf) return row_max;
  const __m512 sh = _mm512_set1_ps(row_max);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = vec::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), sh));
    _mm512_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  for (; j + 8 <= n; j += 8) {
    const __m256 e = vec::exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(row_max)));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float total = vec::hsum(acc);
  for (; j < n; ++j) total += s[j] = std::exp(s[j] - row_max);
  *sum = total;
  return row_max;
}

// Backward: p = e^(s sc - lse) (0 past valid) into s, dS = p (dP - di) sc into dp.
CASTOR_AVX512 void softmax_grad_row_avx512(float* s, float* dp, int64_t n, int64_t valid, float sc, float lse,
                                           float di) {
  const __m512 scv = _mm512_set1_ps(sc), l = _mm512_set1_ps(lse), d = _mm512_set1_ps(di);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 x = _mm512_mask_mov_ps(neg_inf, lanes(valid - j), _mm512_mul_ps(_mm512_loadu_ps(s + j), scv));
    const __m512 p = vec::exp16(_mm512_sub_ps(x, l));
    _mm512_storeu_ps(s + j, p);
    _mm512_storeu_ps(dp + j, _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + j), d)), scv));
  }
  for (; j + 8 <= n; j += 8) {
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(valid - j, 8))),
                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(kNegInf),
                                      _mm256_mul_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(sc)), keep);
    const __m256 p = vec::exp(_mm256_sub_ps(x, _mm256_set1_ps(lse)));
    _mm256_storeu_ps(s + j, p);
    _mm256_storeu_ps(dp + j, _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + j), _mm256_set1_ps(di))),
                                           _mm256_set1_ps(sc)));
  }
  for (; j < n; ++j) {
    s[j] = std::exp((j < valid ? s[j] * sc : kNegInf) - lse);
    dp[j] = s[j] * (dp[j] - di) * sc;
  }
}

CASTOR_AVX512_END

// Heads per product: as many as keep a group's (block, Tk) scores near 256 KiB (fewer, larger products for short
// sequences), a divisor of H, while leaving each thread two tasks or more. The backward's tasks each take
// max(G, rep) query heads, every query head sharing a k/v head (`rep` of them) in one task, which sums their dK, dV:
// there G is also a divisor or a multiple of rep.
int64_t head_group(int64_t B, int64_t H, int64_t tasks_per_head, int64_t Tk, int64_t rep = 1) {
  const int64_t threads = omp_get_max_threads();
  int64_t G = std::clamp<int64_t>((64 * 1024) / (kBlockRows * std::max<int64_t>(Tk, 1)), 1, H);
  auto fits = [&](int64_t g) {
    return H % g == 0 && (g % rep == 0 || rep % g == 0) &&
           (g == 1 || B * (H / std::max(g, rep)) * tasks_per_head >= 2 * threads);
  };
  while (!fits(G)) --G;
  return G;
}

// Per-thread scratch as caching-allocator tensors (counted by memory_stats()).
struct Scratch {
  Tensor t;
  explicit Scratch(int64_t floats) : t(empty({std::max<int64_t>(floats, 1)}, DType::Float32)) {}
  float* at(int64_t offset) const { return static_cast<float*>(t.data_ptr()) + offset; }
};

// Checks dtypes and heads; returns the query heads per k/v head.
int64_t check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse) {
  CASTOR_ASSERT(k.dtype() == q.dtype() && v.dtype() == q.dtype() && lse.dtype() == DType::Float32 && k.size(1) > 0 &&
                    q.size(1) % k.size(1) == 0 && v.size(1) == k.size(1),
                "attention: q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), ", lse ", lse.describe());
  return q.size(1) / k.size(1);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                       double scale, const Tensor& dst, const Tensor& lse) {
  if (q.dtype() == DType::Float64) return attention_forward_ref(q, k, v, mask, is_causal, scale, dst, lse);
  const int64_t rep = check_inputs(q, k, v, lse);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  if (dst.numel() == 0) return;
  CASTOR_ASSERT(dst.is_contiguous(), "attention_forward: dst ", dst.describe(), " is not contiguous");
  const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, DType::Float32);
  const Plan pl = plan(q.dtype());
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows, G = head_group(B, H, blocks, Tk);
  const int64_t groups = H / G, tasks = B * groups * blocks;
  const Rows qr(q), kr(k, rep), vr(v, rep), out(dst);
  float* lz = lse.data<float>();
  const float sc = static_cast<float>(scale);
  const bool fast_rows = avx512_kernels() && !am.values.defined();
  std::string err;  // the first oneDNN error of any thread (exceptions must not leave the parallel region)
#pragma omp parallel if (tasks > 1 && B * H * Tq * Tk * D > kParallelGrain)
  {
    // Per group of G heads: S (block, Tk) float32, P (block, Tk) rounded, O (block, D); dense Q (block, D), K and
    // V (Tk, D).
    const int64_t s_sz = G * kBlockRows * Tk, o_sz = G * kBlockRows * D, w_sz = G * (kBlockRows + 2 * Tk) * D;
    const Scratch scratch(2 * s_sz + o_sz + w_sz);
    float *S = scratch.at(0), *P = scratch.at(s_sz), *O = scratch.at(2 * s_sz);
    float *Qw = scratch.at(2 * s_sz + o_sz), *Kw = Qw + G * kBlockRows * D, *Vw = Kw + G * Tk * D;
    std::vector<float> inv_l(G * kBlockRows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) try {
        // Heavy (late, causal) blocks first.
        const int64_t bg = task / blocks, blk = blocks - 1 - task % blocks, b = bg / groups, h0 = (bg % groups) * G;
        const int64_t i0 = blk * kBlockRows, m = std::min(kBlockRows, Tq - i0), n = key_limit(is_causal, i0 + m, Tk);
        const Mat Qm = qr.block(pl, b, h0, G, i0, m, Qw), Km = kr.block(pl, b, h0, G, 0, n, Kw),
                  Vm = vr.block(pl, b, h0, G, 0, n, Vw);
        gemm(pl.mdt, G, m, n, D, Qm, Km.t(), S, n, m * n, false);  // S = Q K^T
        for (int64_t g = 0; g < G; ++g)
          for (int64_t r = 0; r < m; ++r) {
            float* s = S + (g * m + r) * n;
            float mx, l = 0.0f;
            if (fast_rows) {
              mx = softmax_row_avx512(s, n, is_causal ? i0 + r + 1 : n, sc, &l);
            } else {
              for (int64_t j = 0; j < n; ++j) s[j] *= sc;
              am.apply(b, h0 + g, i0 + r, 0, n, s);
              mx = vec::max(s, n);
              if (mx != kNegInf) l = vec::exp_shifted(s, n, mx);
            }
            if (mx == kNegInf) std::fill(s, s + n, 0.0f);  // fully masked: output 0
            lz[((b * H + h0 + g) * Tq) + i0 + r] = mx == kNegInf ? kNegInf : mx + std::log(l);
            inv_l[g * m + r] = mx == kNegInf ? 0.0f : 1.0f / l;
          }
        // P rounded to the products' type (bfloat16 into P's buffer, float16 in place in S).
        void* Pp = pl.pdt == DType::BFloat16 ? static_cast<void*>(P) : static_cast<void*>(S);
        round_for_product(pl, S, Pp, G * m * n);
        gemm(pl.mdt, G, m, D, n, Mat{Pp, n, 1, m * n}, Vm, O, D, m * D, false);  // O = P V
        for (int64_t g = 0; g < G; ++g)
          for (int64_t r = 0; r < m; ++r) {
            float* o = O + (g * m + r) * D;
            const float il = inv_l[g * m + r];
            for (int64_t d = 0; d < D; ++d) o[d] *= il;
            convert_serial(o, DType::Float32, out.at(b, h0 + g, i0 + r), out.dt, D);
          }
      } catch (const dnnl::error& e) {
#pragma omp critical
        if (err.empty()) err = e.what();
      }
  }
  CASTOR_CHECK(err.empty(), "attention_forward: oneDNN failed on ", q.describe(), ": ", err);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                        double scale, const Tensor& dst, const Tensor& lse, const Tensor& diff_dst,
                        const Tensor& diff_q, const Tensor& diff_k, const Tensor& diff_v) {
  if (q.dtype() == DType::Float64)
    return attention_backward_ref(q, k, v, mask, is_causal, scale, dst, lse, diff_dst, diff_q, diff_k, diff_v);
  const int64_t rep = check_inputs(q, k, v, lse);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, DType::Float32);
  const Plan pl = plan(q.dtype());
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows, G = head_group(B, H, 1, Tk, rep);
  const int64_t Qh = std::max(G, rep), groups = H / Qh;  // query heads per task (whole k/v heads), tasks per batch
  const Rows qr(q), kr(k, rep), vr(v, rep), yr(dst), dyr(diff_dst), dqr(diff_q), dkr(diff_k, rep), dvr(diff_v, rep);
  const float* lz = lse.data<float>();
  const float sc = static_cast<float>(scale);
  const bool fast_rows = avx512_kernels() && !am.values.defined();
  std::string err;  // the first oneDNN error of any thread
#pragma omp parallel if (B * groups > 1 && B * H * Tq * Tk * D > kParallelGrain)
  {
    // Per product group of G heads: S/P and dP/dS (block, Tk) float32, the rounded P and dS (block, Tk), dQ (block,
    // D); dense Q, dO (block, D), K and V (Tk, D). Per task: dK and dV (Tk, D) float32 of its Qh / rep k/v heads.
    const int64_t s_sz = G * kBlockRows * Tk, o_sz = G * kBlockRows * D, kv_sz = G * Tk * D;
    const int64_t acc_sz = Qh / rep * Tk * D, w_sz = 2 * o_sz + 2 * kv_sz;
    const Scratch scratch(4 * s_sz + o_sz + 2 * acc_sz + w_sz);
    float *S = scratch.at(0), *dP = scratch.at(s_sz), *P16 = scratch.at(2 * s_sz), *dS16 = scratch.at(3 * s_sz);
    float *dQ = scratch.at(4 * s_sz), *dK = dQ + o_sz, *dV = dK + acc_sz;
    float *Qw = dV + acc_sz, *dOw = Qw + o_sz, *Kw = dOw + o_sz, *Vw = Kw + kv_sz;
    std::vector<float> o_row(D), g_row(D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * groups; ++bg) try {
        const int64_t b = bg / groups, hq0 = (bg % groups) * Qh;
        std::fill(dK, dK + acc_sz, 0.0f);
        std::fill(dV, dV + acc_sz, 0.0f);
        for (int64_t c0 = 0; c0 < Qh; c0 += G) {  // product groups of G query heads
          const int64_t h0 = hq0 + c0;
          for (int64_t blk = 0; blk < blocks; ++blk) {
            const int64_t i0 = blk * kBlockRows, m = std::min(kBlockRows, Tq - i0);
            const int64_t n = key_limit(is_causal, i0 + m, Tk);
            const Mat Qm = qr.block(pl, b, h0, G, i0, m, Qw), dOm = dyr.block(pl, b, h0, G, i0, m, dOw);
            const Mat Km = kr.block(pl, b, h0, G, 0, n, Kw), Vm = vr.block(pl, b, h0, G, 0, n, Vw);
            gemm(pl.mdt, G, m, n, D, Qm, Km.t(), S, n, m * n, false);    // S = Q K^T
            gemm(pl.mdt, G, m, n, D, dOm, Vm.t(), dP, n, m * n, false);  // dP = dO V^T
            for (int64_t g = 0; g < G; ++g)
              for (int64_t r = 0; r < m; ++r) {
                float *s = S + (g * m + r) * n, *dp = dP + (g * m + r) * n;
                const float l = lz[((b * H + h0 + g) * Tq) + i0 + r];
                if (l == kNegInf) {  // fully masked row: no gradient
                  std::fill(s, s + n, 0.0f);
                  std::fill(dp, dp + n, 0.0f);
                  continue;
                }
                // D_i = rowsum(dO_i * O_i) in float32.
                convert_serial(yr.at(b, h0 + g, i0 + r), yr.dt, o_row.data(), DType::Float32, D);
                convert_serial(dyr.at(b, h0 + g, i0 + r), dyr.dt, g_row.data(), DType::Float32, D);
                float di = 0;
                for (int64_t d = 0; d < D; ++d) di += o_row[d] * g_row[d];
                if (fast_rows) {
                  softmax_grad_row_avx512(s, dp, n, is_causal ? i0 + r + 1 : n, sc, l, di);
                  continue;
                }
                for (int64_t j = 0; j < n; ++j) s[j] *= sc;
                am.apply(b, h0 + g, i0 + r, 0, n, s);
                vec::exp_shifted(s, n, l);
                for (int64_t j = 0; j < n; ++j) dp[j] = s[j] * (dp[j] - di) * sc;  // dS, scaled
              }
            // Rounded P and dS: bfloat16 into their buffers, float16 in place.
            void* Pp = pl.pdt == DType::BFloat16 ? static_cast<void*>(P16) : static_cast<void*>(S);
            void* dSp = pl.pdt == DType::BFloat16 ? static_cast<void*>(dS16) : static_cast<void*>(dP);
            round_for_product(pl, S, Pp, G * m * n);
            round_for_product(pl, dP, dSp, G * m * n);
            const Mat Pm{Pp, n, 1, m * n}, dSm{dSp, n, 1, m * n};
            // dV += P^T dO, dK += dS^T Q, a head at a time into its k/v head's accumulator (the sum over the query heads
            // sharing it): the accumulators' first n rows are dense per head only.
            const size_t pes = pl.pdt == DType::BFloat16 ? 2 : 4, oes = pl.widen ? 4 : q.element_size();
            for (int64_t g = 0; g < G; ++g) {
              auto head = [&](const Mat& x, size_t es) {
                return Mat{static_cast<const char*>(x.p) + g * x.bs * es, x.rs, x.cs, x.bs};
              };
              const int64_t acc = (c0 + g) / rep * Tk * D;
              if (diff_v.defined())
                gemm(pl.mdt, 1, n, D, m, head(Pm, pes).t(), head(dOm, oes), dV + acc, D, n * D, true);
              if (diff_k.defined())
                gemm(pl.mdt, 1, n, D, m, head(dSm, pes).t(), head(Qm, oes), dK + acc, D, n * D, true);
            }
            if (diff_q.defined()) {
              gemm(pl.mdt, G, m, D, n, dSm, Km, dQ, D, m * D, false);  // dQ = dS K
              for (int64_t g = 0; g < G; ++g)
                for (int64_t r = 0; r < m; ++r)
                  convert_serial(dQ + (g * m + r) * D, DType::Float32, dqr.at(b, h0 + g, i0 + r), dqr.dt, D);
            }
          }
        }
        for (int64_t kv = 0; kv < Qh / rep; ++kv)
          for (int64_t j = 0; j < Tk; ++j) {
            const int64_t at = (kv * Tk + j) * D, h = hq0 + kv * rep;
            if (diff_k.defined()) convert_serial(dK + at, DType::Float32, dkr.at(b, h, j), dkr.dt, D);
            if (diff_v.defined()) convert_serial(dV + at, DType::Float32, dvr.at(b, h, j), dvr.dt, D);
          }
      } catch (const dnnl::error& e) {
#pragma omp critical
        if (err.empty()) err = e.what();
      }
  }
  CASTOR_CHECK(err.empty(), "attention_backward: oneDNN failed on ", q.describe(), ": ", err);
}

}  // namespace castor::kernels
