// Flash-style attention on oneDNN products: a block of query rows against the keys up to its causal limit, the
// scores and probabilities of that block only (per-thread scratch O(block * Tk)), softmax statistics in float32.
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/onednn/onednn.h"
#include "kernels/ref/transformer_util.h"
#include "kernels/transformer.h"

namespace castor::kernels {

namespace {

using dnnl::memory;

constexpr int64_t kBlockRows = 64;  // query rows per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// C (M, N) float32 (row stride ldc) = A (M, K) x B (K, N) (+ C when accumulating), A and B of type dt with any
// strides (one of each pair 1).
struct GemmKey {
  int64_t dt, m, n, k, a_rs, a_cs, b_rs, b_cs, ldc, accumulate;
};

// A cached product with a user-managed scratchpad: threads run the same primitive at once, each with its own
// scratchpad (a library scratchpad may be private to the primitive, which then must not run concurrently).
struct Gemm {
  dnnl::matmul prim;
  size_t scratch_bytes;
};

std::unique_ptr<Gemm> build_gemm(const GemmKey& g) {
  const auto dt = static_cast<memory::data_type>(g.dt);
  memory::desc a({g.m, g.k}, dt, {g.a_rs, g.a_cs}), b({g.k, g.n}, dt, {g.b_rs, g.b_cs});
  memory::desc c({g.m, g.n}, memory::data_type::f32, {g.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
    return std::make_unique<Gemm>(Gemm{dnnl::matmul(pd), pd.scratchpad_desc().get_size()});
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return nullptr;
}

const Gemm* cached_gemm(const GemmKey& k) {
  static PrimitiveCache<GemmKey, Gemm> cache;
  return cache.get(k, build_gemm);
}

// A matrix operand: element (r, c) at p + (r * rs + c * cs) * element size.
struct Mat {
  const void* p;
  int64_t rs, cs;
  Mat t() const { return {p, cs, rs}; }
};

void gemm(memory::data_type dt, int64_t m, int64_t n, int64_t k, Mat a, Mat b, float* c, int64_t ldc,
          bool accumulate) {
  if (m == 0 || n == 0) return;
  const GemmKey key{static_cast<int64_t>(dt), m, n, k, a.rs, a.cs, b.rs, b.cs, ldc, accumulate};
  const Gemm* g = cached_gemm(key);
  CASTOR_ASSERT(g, "attention: oneDNN has no matmul for this shape");
  thread_local std::vector<char> scratchpad;
  if (scratchpad.size() < g->scratch_bytes) scratchpad.resize(g->scratch_bytes);
  memory am({{m, k}, dt, {a.rs, a.cs}}, engine(), const_cast<void*>(a.p));
  memory bm({{k, n}, dt, {b.rs, b.cs}}, engine(), const_cast<void*>(b.p));
  memory cm({{m, n}, memory::data_type::f32, {ldc, 1}}, engine(), c);
  memory sm({{static_cast<int64_t>(g->scratch_bytes)}, memory::data_type::u8, {1}}, engine(), scratchpad.data());
  g->prim.execute(stream(),
                  {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
}

// How one call runs its products: on the storage dtype in place (float32; bfloat16 where oneDNN has a native
// kernel), or on float32 copies of the 16-bit values (float16; bfloat16 otherwise).
struct Plan {
  DType dt;         // storage dtype of q, k, v, dst, diff_dst
  bool widen;       // products on float32 copies
  memory::data_type mdt;  // the products' input type
  DType pdt;        // the dtype of the rounded probability / dS buffers the products read
};

// Whether oneDNN has a native bfloat16 matmul here (its reference implementation, all it has without AVX-512, is
// far slower than the float32 emulation).
bool native_bf16() {
  static const bool native = [] {
    const memory::desc a({64, 64}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc c({64, 64}, memory::data_type::f32, memory::format_tag::ab);
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine());
      return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

Plan plan(DType dt) {
  Plan p{dt, false, memory::data_type::f32, DType::Float32};
  if (dt == DType::BFloat16) {
    if (native_bf16()) {
      p.mdt = memory::data_type::bf16;
      p.pdt = DType::BFloat16;
    } else {
      p.widen = true;
    }
  } else if (dt == DType::Float16) {
    p.widen = true;
  }
  return p;
}

// Rows [r0, r0 + n) of head (b, h) of a (B, H, T, D) tensor as a product operand: in place, or widened into `buf`.
Mat rows(const Tensor& x, const Plan& pl, int64_t b, int64_t h, int64_t r0, int64_t n, float* buf) {
  const int64_t D = x.size(3);
  const char* base = static_cast<const char*>(x.data_ptr()) +
                     (b * x.stride(0) + h * x.stride(1) + r0 * x.stride(2)) * x.element_size();
  if (!pl.widen) return {base, x.stride(2), 1};
  for (int64_t r = 0; r < n; ++r) convert(base + r * x.stride(2) * x.element_size(), x.dtype(), buf + r * D, DType::Float32, D);
  return {buf, D, 1};
}

// Row r of head (b, h) of a (B, H, T, D) tensor, for writing.
char* row_out(const Tensor& x, int64_t b, int64_t h, int64_t r) {
  return static_cast<char*>(x.data_ptr()) + (b * x.stride(0) + h * x.stride(1) + r * x.stride(2)) * x.element_size();
}

// n float32 values rounded to the dtype the products read: into `dst` (2 bytes each) for bfloat16; for the widened
// float16 path rounded to float16 and back in place (src == dst as float32). Float32 stays as is.
void round_for_product(const Plan& pl, float* src, void* dst, int64_t n) {
  if (pl.pdt == DType::BFloat16) {
    convert_f32_to_bf16(src, static_cast<uint16_t*>(dst), n);
  } else if (pl.dt != DType::Float32) {
    uint16_t tmp[kBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t m = std::min(kBlock, n - j0);
      convert(src + j0, DType::Float32, tmp, pl.dt, m);
      convert(tmp, pl.dt, src + j0, DType::Float32, m);
    }
  }
}

// The keys query row i may see: [0, limit).
int64_t key_limit(bool causal, int64_t i_end, int64_t Tk) { return causal ? std::min(Tk, i_end) : Tk; }

// Per-thread scratch as caching-allocator tensors (counted by memory_stats()).
struct Scratch {
  Tensor t;
  explicit Scratch(int64_t floats) : t(empty({std::max<int64_t>(floats, 1)}, DType::Float32)) {}
  float* at(int64_t offset) const { return static_cast<float*>(t.data_ptr()) + offset; }
};

void check_dtypes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse) {
  CASTOR_ASSERT(k.dtype() == q.dtype() && v.dtype() == q.dtype() && lse.dtype() == DType::Float32,
                "attention: q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), ", lse ", lse.describe());
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                       double scale, const Tensor& dst, const Tensor& lse) {
  if (q.dtype() == DType::Float64) return attention_forward_ref(q, k, v, mask, is_causal, scale, dst, lse);
  check_dtypes(q, k, v, lse);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  if (dst.numel() == 0) return;
  const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, DType::Float32);
  const Plan pl = plan(q.dtype());
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows, tasks = B * H * blocks;
  float* lz = lse.data<float>();
  const float sc = static_cast<float>(scale);
  std::string err;  // the first oneDNN error of any thread (exceptions must not leave the parallel region)
#pragma omp parallel if (tasks > 1 && B * H * Tq * Tk * D > kParallelGrain)
    {
      // S (block, Tk) float32, P (block, Tk) rounded, O (block, D); widened Q (block, D), K and V (Tk, D).
      const int64_t s_sz = kBlockRows * Tk, o_sz = kBlockRows * D, w_sz = pl.widen ? (kBlockRows + 2 * Tk) * D : 0;
      const Scratch scratch(2 * s_sz + o_sz + w_sz);
      float *S = scratch.at(0), *P = scratch.at(s_sz), *O = scratch.at(2 * s_sz);
      float *Qw = scratch.at(2 * s_sz + o_sz), *Kw = Qw + kBlockRows * D, *Vw = Kw + Tk * D;
      const size_t es = q.element_size();
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) try {
        // Heavy (late, causal) blocks first.
        const int64_t bh = task / blocks, blk = blocks - 1 - task % blocks, b = bh / H, h = bh % H;
        const int64_t i0 = blk * kBlockRows, m = std::min(kBlockRows, Tq - i0), n = key_limit(is_causal, i0 + m, Tk);
        const Mat Qm = rows(q, pl, b, h, i0, m, Qw), Km = rows(k, pl, b, h, 0, n, Kw), Vm = rows(v, pl, b, h, 0, n, Vw);
        gemm(pl.mdt, m, n, D, Qm, Km.t(), S, n, false);
        float inv_l[kBlockRows];
        for (int64_t r = 0; r < m; ++r) {
          float* s = S + r * n;
          for (int64_t j = 0; j < n; ++j) s[j] *= sc;
          am.apply(b, h, i0 + r, 0, n, s);
          const float mx = vec::max(s, n);
          float l = 0;
          if (mx == kNegInf) {
            std::fill(s, s + n, 0.0f);
          } else {
            l = vec::exp_shifted(s, n, mx);
          }
          lz[bh * Tq + i0 + r] = mx == kNegInf ? kNegInf : mx + std::log(l);
          inv_l[r] = mx == kNegInf ? 0.0f : 1.0f / l;
        }
        // P rounded to the products' type (bfloat16 into P's buffer, float16 in place in S).
        void* Pp = pl.pdt == DType::BFloat16 ? static_cast<void*>(P) : static_cast<void*>(S);
        round_for_product(pl, S, Pp, m * n);
        gemm(pl.mdt, m, D, n, Mat{Pp, n, 1}, Vm, O, D, false);
        for (int64_t r = 0; r < m; ++r) {
          float* o = O + r * D;
          for (int64_t d = 0; d < D; ++d) o[d] *= inv_l[r];
          convert(o, DType::Float32, static_cast<char*>(dst.data_ptr()) + ((bh * Tq) + i0 + r) * D * es, q.dtype(),
                  D);
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
  check_dtypes(q, k, v, lse);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, DType::Float32);
  const Plan pl = plan(q.dtype());
  const int64_t blocks = (Tq + kBlockRows - 1) / kBlockRows;
  const float* lz = lse.data<float>();
  const float sc = static_cast<float>(scale);
  const DType dt = q.dtype();
  std::string err;  // the first oneDNN error of any thread
#pragma omp parallel if (B * H > 1 && B * H * Tq * Tk * D > kParallelGrain)
    {
      // S/P and dP/dS (block, Tk) float32, the rounded P and dS (block, Tk), dQ (block, D), dK and dV (Tk, D)
      // float32; widened Q, dO (block, D), K and V (Tk, D).
      const int64_t s_sz = kBlockRows * Tk, o_sz = kBlockRows * D, w_sz = pl.widen ? (2 * kBlockRows + 2 * Tk) * D : 0;
      const Scratch scratch(4 * s_sz + o_sz + 2 * Tk * D + w_sz);
      float *S = scratch.at(0), *dP = scratch.at(s_sz), *P16 = scratch.at(2 * s_sz), *dS16 = scratch.at(3 * s_sz);
      float *dQ = scratch.at(4 * s_sz), *dK = dQ + o_sz, *dV = dK + Tk * D;
      float *Qw = dV + Tk * D, *dOw = Qw + kBlockRows * D, *Kw = dOw + kBlockRows * D, *Vw = Kw + Tk * D;
      alignas(32) float o_row[kBlock], g_row[kBlock];
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < B * H; ++bh) try {
        const int64_t b = bh / H, h = bh % H;
        std::fill(dK, dK + Tk * D, 0.0f);
        std::fill(dV, dV + Tk * D, 0.0f);
        const Mat Km = rows(k, pl, b, h, 0, Tk, Kw), Vm = rows(v, pl, b, h, 0, Tk, Vw);
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t i0 = blk * kBlockRows, m = std::min(kBlockRows, Tq - i0);
          const int64_t n = key_limit(is_causal, i0 + m, Tk);
          const Mat Qm = rows(q, pl, b, h, i0, m, Qw), dOm = rows(diff_dst, pl, b, h, i0, m, dOw);
          gemm(pl.mdt, m, n, D, Qm, Km.t(), S, n, false);   // S = Q K^T
          gemm(pl.mdt, m, n, D, dOm, Vm.t(), dP, n, false);  // dP = dO V^T
          for (int64_t r = 0; r < m; ++r) {
            float *s = S + r * n, *dp = dP + r * n;
            const float l = lz[bh * Tq + i0 + r];
            if (l == kNegInf) {  // fully masked row: no gradient
              std::fill(s, s + n, 0.0f);
              std::fill(dp, dp + n, 0.0f);
              continue;
            }
            for (int64_t j = 0; j < n; ++j) s[j] *= sc;
            am.apply(b, h, i0 + r, 0, n, s);
            vec::exp_shifted(s, n, l);
            // D_i = rowsum(dO_i * O_i) in float32.
            convert(row_out(dst, b, h, i0 + r), dt, o_row, DType::Float32, D);
            convert(row_out(diff_dst, b, h, i0 + r), dt, g_row, DType::Float32, D);
            float di = 0;
            for (int64_t d = 0; d < D; ++d) di += o_row[d] * g_row[d];
            for (int64_t j = 0; j < n; ++j) dp[j] = s[j] * (dp[j] - di) * sc;  // dS, scaled
          }
          // Rounded P and dS: bfloat16 into their buffers, float16 in place.
          void* Pp = pl.pdt == DType::BFloat16 ? static_cast<void*>(P16) : static_cast<void*>(S);
          void* dSp = pl.pdt == DType::BFloat16 ? static_cast<void*>(dS16) : static_cast<void*>(dP);
          round_for_product(pl, S, Pp, m * n);
          round_for_product(pl, dP, dSp, m * n);
          if (diff_v.defined()) gemm(pl.mdt, n, D, m, Mat{Pp, n, 1}.t(), dOm, dV, D, true);  // dV += P^T dO
          if (diff_k.defined()) gemm(pl.mdt, n, D, m, Mat{dSp, n, 1}.t(), Qm, dK, D, true);  // dK += dS^T Q
          if (diff_q.defined()) {
            gemm(pl.mdt, m, D, n, Mat{dSp, n, 1}, Km, dQ, D, false);  // dQ = dS K
            for (int64_t r = 0; r < m; ++r)
              convert(dQ + r * D, DType::Float32, row_out(diff_q, b, h, i0 + r), dt, D);
          }
        }
        for (int64_t j = 0; j < Tk; ++j) {
          if (diff_k.defined()) convert(dK + j * D, DType::Float32, row_out(diff_k, b, h, j), dt, D);
          if (diff_v.defined()) convert(dV + j * D, DType::Float32, row_out(diff_v, b, h, j), dt, D);
        }
      } catch (const dnnl::error& e) {
#pragma omp critical
        if (err.empty()) err = e.what();
      }
    }
  CASTOR_CHECK(err.empty(), "attention_backward: oneDNN failed on ", q.describe(), ": ", err);
}

}  // namespace castor::kernels
