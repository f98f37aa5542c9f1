// Reference loops of the transformer kernels: layer/RMS norm and embedding backward (row-wise, also the fast path),
// cross-entropy and naive full-matrix attention (the float64 path and the oracle of the fast kernels).
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "castor/convert.h"
#include "kernels/kernels.h"
#include "kernels/ref/loops.h"
#include "kernels/ref/transformer_util.h"
#include "kernels/transformer.h"

namespace castor::kernels {

namespace {

// n elements at element offset `at` of a tensor's buffer, converted into dst (a T buffer), and back.
template <class T>
void load(const Tensor& t, int64_t at, T* dst, int64_t n) {
  convert(static_cast<const char*>(t.data_ptr()) + at * t.element_size(), t.dtype(), dst, dtype_of<T>(), n);
}
template <class T>
void store(const T* src, const Tensor& t, int64_t at, int64_t n) {
  convert(src, dtype_of<T>(), static_cast<char*>(t.data_ptr()) + at * t.element_size(), t.dtype(), n);
}

// A per-channel parameter as n values of T (ones / zeros when undefined).
template <class T>
std::vector<T> params(const Tensor& p, int64_t n, T fallback) {
  std::vector<T> v(n, fallback);
  if (p.defined()) load(p, 0, v.data(), n);
  return v;
}

template <class T>
T* stat_ptr(const Tensor& t) {
  if (!t.defined()) return nullptr;
  CASTOR_ASSERT(t.dtype() == dtype_of<T>(), "statistics tensor ", t.describe(), " should be ",
                dtype_name(dtype_of<T>()));
  return static_cast<T*>(t.data_ptr());
}

// Row r (of C) of a contiguous tensor as T: a pointer into it when it holds T, else converted into buf.
template <class T>
const T* row_in(const Tensor& t, int64_t r, int64_t C, T* buf) {
  if (t.dtype() == dtype_of<T>()) return static_cast<const T*>(t.data_ptr()) + r * C;
  load(t, r * C, buf, C);
  return buf;
}
// Where to compute row r of t: in place when it holds T, else in buf, rounded into t by row_done.
template <class T>
T* row_out(const Tensor& t, int64_t r, int64_t C, T* buf) {
  return t.dtype() == dtype_of<T>() ? static_cast<T*>(t.data_ptr()) + r * C : buf;
}
template <class T>
void row_done(const T* row, const Tensor& t, int64_t r, int64_t C) {
  if (t.dtype() != dtype_of<T>()) store(row, t, r * C, C);
}

// Layer norm (rms = false) or RMS norm forward over rows of C. The loops vectorise (omp simd; the sums reassociated
// into lane-wise partial sums). Layer norm's 16-bit output is one rounding of the float32 result (PyTorch's kernel);
// RMS norm's is weight * (the normalised row rounded to the 16-bit type), rounded: the cast order of torch's
// rms_norm, llama2.c's model.py and Hugging Face's LlamaRMSNorm / Qwen2RMSNorm alike (hidden.to(float32), x *
// rsqrt(var + eps), then weight * x.to(input_dtype)).
template <class T>
void norm_forward(const Tensor& src, const Tensor& weight, const Tensor& bias, const Tensor& dst, const Tensor& mean,
                  const Tensor& rstd, double eps, bool rms) {
  const int64_t C = src.size(-1), rows = C ? src.numel() / C : 0;
  const std::vector<T> w = params<T>(weight, C, 1), b = params<T>(bias, C, 0);
  const T *wp = w.data(), *bp = b.data();
  T *mu = stat_ptr<T>(mean), *rs = stat_ptr<T>(rstd);
  const bool round_first = rms && dst.dtype() != dtype_of<T>();  // a 16-bit RMS norm
#pragma omp parallel if (rows * C > kParallelGrain)
  {
    std::vector<T> xbuf(C), ybuf(C);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = row_in(src, r, C, xbuf.data());
      T m = 0, ss = 0;
      if (!rms) {
#pragma omp simd reduction(+ : m)
        for (int64_t j = 0; j < C; ++j) m += x[j];
        m /= static_cast<T>(C);
      }
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < C; ++j) ss += (x[j] - m) * (x[j] - m);
      const T inv = T(1) / std::sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
      T* y = row_out(dst, r, C, ybuf.data());
      if (round_first) {  // x * inv rounded to dst's type, through dst's row
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) y[j] = x[j] * inv;
        row_done(y, dst, r, C);
        load(dst, r * C, y, C);
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) y[j] *= wp[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) y[j] = (x[j] - m) * inv * wp[j] + bp[j];
      }
      row_done(y, dst, r, C);
      if (mu) mu[r] = m;
      if (rs) rs[r] = inv;
    }
  }
}

template <class T>
void norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, const Tensor& diff_src, const Tensor& diff_weight, const Tensor& diff_bias,
                   bool rms) {
  const int64_t C = src.size(-1), rows = C ? src.numel() / C : 0;
  const std::vector<T> w = params<T>(weight, C, 1);
  const T* wp = w.data();
  const T *mu = stat_ptr<T>(mean), *rs = stat_ptr<T>(rstd);
  const bool want_params = diff_weight.defined() || diff_bias.defined();
  // Per-thread partial sums of dy * xhat and dy, added in thread order afterwards.
  const bool par = rows * C > kParallelGrain;
  const int threads = par ? omp_get_max_threads() : 1;
  std::vector<std::vector<T>> dw(threads), db(threads);
#pragma omp parallel if (par)
  {
    const int tid = omp_get_thread_num();
    std::vector<T> xbuf(C), dybuf(C), xhat(C), g(C), dxbuf(C);
    T *xh = xhat.data(), *gp = g.data();
    if (want_params) dw[tid].assign(C, 0), db[tid].assign(C, 0);
    T *pw = dw[tid].data(), *pb = db[tid].data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = row_in(src, r, C, xbuf.data());
      const T* dy = row_in(diff_dst, r, C, dybuf.data());
      const T m = rms ? T(0) : mu[r], inv = rs[r];
      T sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t j = 0; j < C; ++j) {
        xh[j] = (x[j] - m) * inv;
        gp[j] = dy[j] * wp[j];
        sum_g += gp[j];
        sum_gx += gp[j] * xh[j];
      }
      if (want_params) {
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) {
          pw[j] += dy[j] * xh[j];
          pb[j] += dy[j];
        }
      }
      if (diff_src.defined()) {
        const T a = rms ? T(0) : sum_g / static_cast<T>(C), c = sum_gx / static_cast<T>(C);
        T* dx = row_out(diff_src, r, C, dxbuf.data());
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) dx[j] = inv * (gp[j] - a - xh[j] * c);
        row_done(dx, diff_src, r, C);
      }
    }
  }
  if (!want_params) return;
  // A team smaller than asked for (inside another parallel region) leaves some partials empty.
  for (int t = 1; t < threads; ++t)
    for (int64_t j = 0; j < static_cast<int64_t>(dw[t].size()); ++j) dw[0][j] += dw[t][j], db[0][j] += db[t][j];
  if (diff_weight.defined()) store(dw[0].data(), diff_weight, 0, C);
  if (diff_bias.defined()) store(db[0].data(), diff_bias, 0, C);
}

}  // namespace

void layer_norm_forward(const Tensor& src, const Tensor& weight, const Tensor& bias, const Tensor& dst,
                        const Tensor& mean, const Tensor& rstd, double eps) {
  with_compute_type(src.dtype(), [&](auto tag) {
    norm_forward<decltype(tag)>(src, weight, bias, dst, mean, rstd, eps, /*rms=*/false);
  });
}

void layer_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& diff_src, const Tensor& diff_weight,
                         const Tensor& diff_bias) {
  with_compute_type(src.dtype(), [&](auto tag) {
    norm_backward<decltype(tag)>(src, diff_dst, weight, mean, rstd, diff_src, diff_weight, diff_bias,
                                 /*rms=*/false);
  });
}

void rms_norm_forward(const Tensor& src, const Tensor& weight, const Tensor& dst, const Tensor& rstd, double eps) {
  with_compute_type(src.dtype(), [&](auto tag) {
    norm_forward<decltype(tag)>(src, weight, Tensor(), dst, Tensor(), rstd, eps, /*rms=*/true);
  });
}

void rms_norm_backward(const Tensor& src, const Tensor& diff_dst, const Tensor& weight, const Tensor& rstd,
                       const Tensor& diff_src, const Tensor& diff_weight) {
  with_compute_type(src.dtype(), [&](auto tag) {
    norm_backward<decltype(tag)>(src, diff_dst, weight, Tensor(), rstd, diff_src, diff_weight, Tensor(),
                                 /*rms=*/true);
  });
}

// ---- Cross-entropy ----

void check_targets(const Tensor& target, int64_t V, int64_t ignore_index) {
  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i)
    CASTOR_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), "cross_entropy: target ", t[i], " out of range for ",
                 V, " classes");
}

void cross_entropy_forward_ref(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                               const Tensor& losses, const Tensor& lse) {
  const int64_t N = logits.size(0), V = logits.size(1);
  check_targets(target, V, ignore_index);
  const int64_t* t = target.data<int64_t>();
  with_compute_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T *loss = stat_ptr<T>(losses), *lz = stat_ptr<T>(lse);
    const T eps = static_cast<T>(label_smoothing);
#pragma omp parallel if (N * V > kParallelGrain)
    {
      std::vector<T> x(V);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        load(logits, i * V, x.data(), V);
        T m = -std::numeric_limits<T>::infinity(), z = 0, sum = 0;
        for (int64_t j = 0; j < V; ++j) m = std::max(m, x[j]);
        for (int64_t j = 0; j < V; ++j) z += std::exp(x[j] - m), sum += x[j];
        const T l = m + std::log(z);
        lz[i] = l;
        loss[i] = t[i] == ignore_index ? T(0) : (1 - eps) * (l - x[t[i]]) + eps * (l - sum / static_cast<T>(V));
      }
    }
  });
}

void cross_entropy_backward_ref(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                const Tensor& diff_losses, int64_t ignore_index, double label_smoothing,
                                const Tensor& diff_logits, int64_t first_class, int64_t classes) {
  const int64_t N = logits.size(0), V = logits.size(1), K = classes > 0 ? classes : V;
  check_targets(target, K, ignore_index);
  const int64_t* t = target.data<int64_t>();
  with_compute_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* lz = stat_ptr<T>(lse);
    const T* g = stat_ptr<T>(diff_losses);
    const T eps = static_cast<T>(label_smoothing), off = eps / static_cast<T>(K);
#pragma omp parallel if (N * V > kParallelGrain)
    {
      std::vector<T> x(V);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        if (t[i] == ignore_index) {
          std::fill(x.begin(), x.end(), T(0));
        } else {
          load(logits, i * V, x.data(), V);
          for (int64_t j = 0; j < V; ++j) x[j] = g[i] * (std::exp(x[j] - lz[i]) - off);
          const int64_t ti = t[i] - first_class;  // the target's column in this block, if it is in it
          if (ti >= 0 && ti < V) x[ti] -= g[i] * (1 - eps);
        }
        store(x.data(), diff_logits, i * V, V);
      }
    }
  });
}

// ---- Embedding backward ----

void embedding_backward(const Tensor& diff_dst, const Tensor& indices, int64_t padding_idx, const Tensor& diff_weight,
                        bool accumulate) {
  const int64_t N = indices.numel(), V = diff_weight.size(0), C = diff_weight.size(1);
  CASTOR_ASSERT(!accumulate || diff_weight.dtype() == DType::Float32 || diff_weight.dtype() == DType::Float64,
                "embedding_backward: accumulates into float32 or float64, not ", diff_weight.describe());
  const int64_t* idx = indices.data<int64_t>();
  // Positions grouped by row, each group in increasing n (a counting sort), so each row sums in the order of n.
  std::vector<int64_t> start(V + 1, 0), order(N);
  for (int64_t n = 0; n < N; ++n) {
    CASTOR_CHECK(idx[n] >= 0 && idx[n] < V, "embedding: index ", idx[n], " out of range for ", V, " rows");
    ++start[idx[n] + 1];
  }
  for (int64_t r = 0; r < V; ++r) start[r + 1] += start[r];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t n = 0; n < N; ++n) order[next[idx[n]]++] = n;
  }
  // The rows written: all of them, or (accumulating) only those indexed, outside padding_idx.
  std::vector<int64_t> rows;
  if (accumulate) {
    for (int64_t r = 0; r < V; ++r)
      if (start[r + 1] > start[r] && r != padding_idx) rows.push_back(r);
  }
  const int64_t R = accumulate ? static_cast<int64_t>(rows.size()) : V;
  with_compute_type(diff_weight.dtype(), [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel if (R * C > kParallelGrain)
    {
      std::vector<T> acc(C), row(C);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < R; ++i) {
        const int64_t r = accumulate ? rows[i] : i;
        std::fill(acc.begin(), acc.end(), T(0));
        if (r != padding_idx)
          for (int64_t p = start[r]; p < start[r + 1]; ++p) {
            load(diff_dst, order[p] * C, row.data(), C);
            for (int64_t j = 0; j < C; ++j) acc[j] += row[j];
          }
        if (accumulate) {  // T is the storage type: the row's sum, then one addition, as summing the dense gradient
          T* dst = static_cast<T*>(diff_weight.data_ptr()) + r * C;
          for (int64_t j = 0; j < C; ++j) dst[j] += acc[j];
        } else {
          store(acc.data(), diff_weight, r * C, C);
        }
      }
    }
  });
}

// ---- Rotary position embedding ----

void rotary_embedding(const Tensor& src, const Tensor& cos, const Tensor& sin, bool interleaved, bool inverse,
                      const Tensor& dst) {
  const int64_t T = src.size(1), H = src.size(2), D = src.size(3), half = D / 2, HD = H * D;
  CASTOR_ASSERT(src.dim() == 4 && D % 2 == 0 && src.is_contiguous() && dst.is_contiguous() &&
                    dst.dtype() == src.dtype() && dst.numel() == src.numel() && cos.dtype() == DType::Float32 &&
                    sin.dtype() == DType::Float32 && cos.numel() == T * half && sin.numel() == T * half &&
                    cos.is_contiguous() && sin.is_contiguous(),
                "rotary_embedding on ", src.describe(), " with tables ", cos.describe(), " -> ", dst.describe());
  if (src.numel() == 0) return;
  // Each pair (a, b) at offsets (i, j) of a head becomes (a c - b s, a s + b c) (s negated for the inverse): per
  // position the tables widened to the head, y = x * cw + partner(x) * sw, with sw = -s at i and +s at j.
  const float *ct = cos.data<float>(), *st = sin.data<float>();
  with_compute_type(src.dtype(), [&](auto tag) {
    using R = decltype(tag);
    std::vector<R> cw(T * D), sw(T * D);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < half; ++k) {
        const int64_t i = t * D + (interleaved ? 2 * k : k), j = i + (interleaved ? 1 : half);
        const R c = ct[t * half + k], sn = inverse ? -st[t * half + k] : st[t * half + k];
        cw[i] = cw[j] = c;
        sw[i] = -sn;
        sw[j] = sn;
      }
    const int64_t rows = src.numel() / HD;  // (b, t): H heads of D sharing position t's tables
#pragma omp parallel if (src.numel() > kParallelGrain)
    {
      std::vector<R> in(HD), out(HD);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const R *c = cw.data() + r % T * D, *sn = sw.data() + r % T * D;
        const R* x = row_in(src, r, HD, in.data());
        R* y = row_out(dst, r, HD, out.data());
        for (int64_t h = 0; h < HD; h += D) {
          const R* xh = x + h;
          R* yh = y + h;
          if (interleaved) {
#pragma omp simd
            for (int64_t d = 0; d < D; d += 2) {
              yh[d] = xh[d] * c[d] + xh[d + 1] * sn[d];
              yh[d + 1] = xh[d + 1] * c[d + 1] + xh[d] * sn[d + 1];
            }
          } else {
#pragma omp simd
            for (int64_t d = 0; d < half; ++d) {
              yh[d] = xh[d] * c[d] + xh[d + half] * sn[d];
              yh[d + half] = xh[d + half] * c[d + half] + xh[d] * sn[d + half];
            }
          }
        }
        row_done(y, dst, r, HD);
      }
    }
  });
}

// ---- Attention ----

namespace {

// Element strides of a (B, H, T, D) view (last dim contiguous).
struct Strides4 {
  int64_t b, h, t;
  explicit Strides4(const Tensor& x) : b(x.stride(0)), h(x.stride(1)), t(x.stride(2)) {
    CASTOR_ASSERT(x.dim() == 4 && (x.size(3) <= 1 || x.stride(3) == 1), "attention: ", x.describe(),
                  " should be (B, H, T, D) with a contiguous last dim");
  }
  int64_t at(int64_t bi, int64_t hi, int64_t ti) const { return bi * b + hi * h + ti * t; }
};

}  // namespace

AttentionMask attention_mask(const Tensor& mask, bool is_causal, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                             DType scores) {
  AttentionMask m;
  m.causal = is_causal;
  if (!mask.defined()) return m;
  CASTOR_CHECK(mask.dim() <= 4, "attention: mask ", mask.describe(), " has more than 4 dims");
  const int64_t want[4] = {B, H, Tq, Tk};
  const int64_t lead = 4 - mask.dim();
  if (mask.dtype() == DType::Bool) {
    m.values = mask;
  } else {
    CASTOR_CHECK(is_floating(mask.dtype()), "attention: mask must be bool or floating, not ", dtype_name(mask.dtype()));
    m.values = empty(mask.shape(), scores);
    copy(mask, m.values);
  }
  for (int d = 0; d < 4; ++d) {
    const int64_t size = d < lead ? 1 : mask.size(d - lead);
    CASTOR_CHECK(size == 1 || size == want[d], "attention: mask ", mask.describe(), " does not broadcast to (", B, ", ",
                 H, ", ", Tq, ", ", Tk, ")");
    m.stride[d] = size == 1 ? 0 : m.values.stride(d - lead);
  }
  return m;
}

namespace {

// One head's scores row i: s[j] = q_i . k_j * scale, masked, for j in [0, Tk).
template <class T>
void naive_head(const T* q, const T* k, const AttentionMask& mask, int64_t bi, int64_t hi, int64_t Tq, int64_t Tk,
                int64_t D, T scale, T* s) {
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j) {
      T acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += q[i * D + d] * k[j * D + d];
      s[i * Tk + j] = acc * scale;
    }
  for (int64_t i = 0; i < Tq; ++i) mask.apply(bi, hi, i, 0, Tk, s + i * Tk);
}

template <class T>
void load_head(const Tensor& x, const Strides4& st, int64_t bi, int64_t hi, int64_t T_, int64_t D, T* dst) {
  for (int64_t t = 0; t < T_; ++t) load(x, st.at(bi, hi, t), dst + t * D, D);
}
template <class T>
void store_head(const T* src, const Tensor& x, int64_t bi, int64_t hi, int64_t T_, int64_t D) {
  const Strides4 st(x);
  for (int64_t t = 0; t < T_; ++t) store(src + t * D, x, st.at(bi, hi, t), D);
}

}  // namespace

void attention_forward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                           double scale, const Tensor& dst, const Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const int64_t rep = H / k.size(1);  // query heads per k/v head
  const Strides4 sq(q), sk(k), sv(v);
  with_compute_type(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, dtype_of<T>());
    T* lz = stat_ptr<T>(lse);
#pragma omp parallel for schedule(static) if (B * H * Tq * Tk * D > kParallelGrain)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t bi = bh / H, hi = bh % H;
      std::vector<T> Q(Tq * D), K(Tk * D), Vv(Tk * D), S(Tq * Tk), O(Tq * D, T(0));
      load_head(q, sq, bi, hi, Tq, D, Q.data());
      load_head(k, sk, bi, hi / rep, Tk, D, K.data());
      load_head(v, sv, bi, hi / rep, Tk, D, Vv.data());
      naive_head(Q.data(), K.data(), am, bi, hi, Tq, Tk, D, static_cast<T>(scale), S.data());
      for (int64_t i = 0; i < Tq; ++i) {
        T* s = S.data() + i * Tk;
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < Tk; ++j) m = std::max(m, s[j]);
        if (m == -std::numeric_limits<T>::infinity()) {  // fully masked: output 0
          lz[bh * Tq + i] = m;
          continue;
        }
        T z = 0;
        for (int64_t j = 0; j < Tk; ++j) z += s[j] = std::exp(s[j] - m);
        for (int64_t j = 0; j < Tk; ++j)
          for (int64_t d = 0; d < D; ++d) O[i * D + d] += s[j] / z * Vv[j * D + d];
        lz[bh * Tq + i] = m + std::log(z);
      }
      store_head(O.data(), dst, bi, hi, Tq, D);
    }
  });
}

void attention_backward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                            double scale, const Tensor& dst, const Tensor& lse, const Tensor& diff_dst,
                            const Tensor& diff_q, const Tensor& diff_k, const Tensor& diff_v) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const int64_t Hkv = k.size(1), rep = H / Hkv;  // query heads per k/v head
  const Strides4 sq(q), sk(k), sv(v), sdo(diff_dst);
  with_compute_type(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const AttentionMask am = attention_mask(mask, is_causal, B, H, Tq, Tk, dtype_of<T>());
    const T* lz = stat_ptr<T>(lse);
    const T sc = static_cast<T>(scale);
    // One task per k/v head: its dK, dV summed over the query heads sharing it, in their order.
#pragma omp parallel for schedule(static) if (B * H * Tq * Tk * D > kParallelGrain)
    for (int64_t bkv = 0; bkv < B * Hkv; ++bkv) {
      const int64_t bi = bkv / Hkv, kvi = bkv % Hkv;
      std::vector<T> Q(Tq * D), K(Tk * D), Vv(Tk * D), dO(Tq * D), S(Tq * Tk), dQ(Tq * D);
      std::vector<T> dK(Tk * D, T(0)), dV(Tk * D, T(0));
      load_head(k, sk, bi, kvi, Tk, D, K.data());
      load_head(v, sv, bi, kvi, Tk, D, Vv.data());
      for (int64_t hi = kvi * rep; hi < (kvi + 1) * rep; ++hi) {
        const int64_t bh = bi * H + hi;
        std::fill(dQ.begin(), dQ.end(), T(0));
        load_head(q, sq, bi, hi, Tq, D, Q.data());
        load_head(diff_dst, sdo, bi, hi, Tq, D, dO.data());
        naive_head(Q.data(), K.data(), am, bi, hi, Tq, Tk, D, sc, S.data());
        for (int64_t i = 0; i < Tq; ++i) {
          const T l = lz[bh * Tq + i];
          T* p = S.data() + i * Tk;
          for (int64_t j = 0; j < Tk; ++j) p[j] = l == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(p[j] - l);
          // dP_ij = dO_i . v_j; dS = P (dP - sum_j P dP).
          std::vector<T> dp(Tk);
          T rowsum = 0;
          for (int64_t j = 0; j < Tk; ++j) {
            T acc = 0;
            for (int64_t d = 0; d < D; ++d) acc += dO[i * D + d] * Vv[j * D + d];
            dp[j] = acc;
            rowsum += p[j] * acc;
          }
          for (int64_t j = 0; j < Tk; ++j) {
            const T ds = p[j] * (dp[j] - rowsum) * sc;
            for (int64_t d = 0; d < D; ++d) {
              dV[j * D + d] += p[j] * dO[i * D + d];
              dQ[i * D + d] += ds * K[j * D + d];
              dK[j * D + d] += ds * Q[i * D + d];
            }
          }
        }
        if (diff_q.defined()) store_head(dQ.data(), diff_q, bi, hi, Tq, D);
      }
      if (diff_k.defined()) store_head(dK.data(), diff_k, bi, kvi, Tk, D);
      if (diff_v.defined()) store_head(dV.data(), diff_v, bi, kvi, Tk, D);
    }
  });
}

}  // namespace castor::kernels
