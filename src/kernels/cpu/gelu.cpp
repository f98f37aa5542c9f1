// GELU (tanh form) forward and its fused backward map on AVX-512 (16 lanes) or, without it, AVX2 (8 lanes, the
// build's baseline), with vec_math's exp: float32 and 16-bit tensors (converted in L1-sized blocks, computed in
// float32, rounded once), chosen at run time by the element-wise kernels (kernels/ref/elementwise.cpp) for dense
// operands. 16-bit tensors compute on float32 lanes (a few float32
// ulps, far below a 16-bit ulp); float32 tensors on float64 lanes (float32 arithmetic loses tens of ulps in the
// tails and near the derivative's zero), rounded once. Also SwiGLU's forward and backward maps on AVX-512 or AVX2 lanes, for
// 16-bit tensors (float32 ones keep the reference loops' float64 derivative).
#include <cmath>
#include <initializer_list>
#include <string>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/vec_math.h"

namespace castor::kernels {

namespace {

CASTOR_AVX512_BEGIN

constexpr float kSqrt2OverPi = 0.79788456080286535588f;

// -2u, u = sqrt(2/pi) (x + 0.044715 x^3); x2 = x * x.
CASTOR_AVX512 inline __m512 minus_2u(__m512 x, __m512 x2) {
  return _mm512_mul_ps(_mm512_set1_ps(-2.0f * kSqrt2OverPi),
                       _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x2), x, x));
}

// Lanes whose -2u exceeds this (x below about -8.3) are recomputed in float64 scalars: there e^(-2u) nears float32's
// overflow and the results its underflow (exp16 saturates and flushes to 0 early); they are rare.
constexpr float kTail = 80.0f;

double gelu_tanh_f64(double x) { return x / (1 + std::exp(-2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad_f64(double x) {
  const double e = std::exp(-2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x)), s = 1 / (1 + e);
  return s + 2 * x * s * (e * s) * 0.79788456080286535588 * (1 + 3 * 0.044715 * x * x);
}

// gelu_tanh(x) = x / (1 + e^(-2u)) (= x sigmoid(2u), no cancellation for x << 0).
CASTOR_AVX512 void gelu_tanh_block(const float* x, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + j), a = minus_2u(v, _mm512_mul_ps(v, v));
    _mm512_mask_storeu_ps(out + j, m, _mm512_div_ps(v, _mm512_add_ps(one, vec::exp16(a))));
    for (unsigned tail = _mm512_mask_cmp_ps_mask(m, a, _mm512_set1_ps(kTail), _CMP_GT_OQ); tail; tail &= tail - 1)
      out[j + __builtin_ctz(tail)] = static_cast<float>(gelu_tanh_f64(x[j + __builtin_ctz(tail)]));
  }
}

// g * gelu_tanh'(x) = g (s + 2 x s (1 - s) u'), s = sigmoid(2u) = 1 / (1 + e), 1 - s = e s, u' = sqrt(2/pi)
// (1 + 3 * 0.044715 x^2).
CASTOR_AVX512 void gelu_tanh_grad_block(const float* g, const float* x, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + j), x2 = _mm512_mul_ps(v, v), a = minus_2u(v, x2);
    const __m512 e = vec::exp16(a);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e)), one_minus_s = _mm512_mul_ps(e, s);
    const __m512 du = _mm512_mul_ps(_mm512_set1_ps(kSqrt2OverPi),
                                    _mm512_fmadd_ps(_mm512_set1_ps(3 * 0.044715f), x2, one));
    const __m512 two_x = _mm512_add_ps(v, v);
    const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(two_x, s), one_minus_s), du, s);
    _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + j), d));
    for (unsigned tail = _mm512_mask_cmp_ps_mask(m, a, _mm512_set1_ps(kTail), _CMP_GT_OQ); tail; tail &= tail - 1) {
      const int64_t i = j + __builtin_ctz(tail);
      out[i] = static_cast<float>(g[i] * gelu_tanh_grad_f64(x[i]));
    }
  }
}

// e^x on 8 float64 lanes, x in [-700, 700]: 2^n e^r, |r| <= ln2/2, Taylor to degree 10 (relative error below 1e-13,
// far below the float32 result's half ulp).
CASTOR_AVX512 inline __m512d exp8d(__m512d x) {
  x = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(-700.0)), _mm512_set1_pd(700.0));
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634074)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.9082149292705877000e-10),
                                     _mm512_fnmadd_pd(n, _mm512_set1_pd(6.9314718036912381649e-1), x));
  __m512d y = _mm512_set1_pd(1.0 / 3628800);
  for (double c : {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0})
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(c));
  const __m512i e = _mm512_slli_epi64(
      _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n)), _mm512_set1_epi64(1023)), 52);
  return _mm512_mul_pd(y, _mm512_castsi512_pd(e));
}

// The float32 forward on float64 lanes, rounded once (in the tails float32 arithmetic would lose tens of ulps: the
// result's relative condition number grows like 2u).
CASTOR_AVX512 void gelu_tanh_block_f64(const float* x, float* out, int64_t n) {
  const __m512d one = _mm512_set1_pd(1.0), k = _mm512_set1_pd(-2 * 0.79788456080286535588);
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask16 m = static_cast<__mmask16>(n - j >= 8 ? 0xffu : (1u << (n - j)) - 1);  // the low 8 lanes
    const __m512d v = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, x + j)));
    const __m512d a = _mm512_mul_pd(
        k, _mm512_fmadd_pd(_mm512_mul_pd(_mm512_set1_pd(0.044715), _mm512_mul_pd(v, v)), v, v));
    const __m512d y = _mm512_div_pd(v, _mm512_add_pd(one, exp8d(a)));
    _mm512_mask_storeu_ps(out + j, m, _mm512_castps256_ps512(_mm512_cvtpd_ps(y)));
  }
}

// The float32 backward: the same formula on float64 lanes, rounded once (the derivative's zero near x = -0.75
// turns float32 rounding errors into tens of ulps of the result; the contract is 8 ulps of the float64 value).
CASTOR_AVX512 void gelu_tanh_grad_block_f64(const float* g, const float* x, float* out, int64_t n) {
  const __m512d one = _mm512_set1_pd(1.0), k = _mm512_set1_pd(0.79788456080286535588);
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask16 m = static_cast<__mmask16>(n - j >= 8 ? 0xffu : (1u << (n - j)) - 1);  // the low 8 lanes
    const __m512d v = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, x + j))),
                  x2 = _mm512_mul_pd(v, v);
    const __m512d u = _mm512_mul_pd(k, _mm512_fmadd_pd(_mm512_mul_pd(_mm512_set1_pd(0.044715), x2), v, v));
    const __m512d e = exp8d(_mm512_mul_pd(_mm512_set1_pd(-2.0), u));
    const __m512d s = _mm512_div_pd(one, _mm512_add_pd(one, e)), one_minus_s = _mm512_mul_pd(e, s);
    const __m512d du = _mm512_mul_pd(k, _mm512_fmadd_pd(_mm512_set1_pd(3 * 0.044715), x2, one));
    const __m512d d = _mm512_fmadd_pd(_mm512_mul_pd(_mm512_mul_pd(_mm512_add_pd(v, v), s), one_minus_s), du, s);
    const __m512d gd = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, g + j)));
    _mm512_mask_storeu_ps(out + j, m, _mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_mul_pd(gd, d))));
  }
}

// The AVX2 twins: the same formulas on 8 float32 / 4 float64 lanes; the last partial vector and the float32 lanes
// past kTail are computed by the float64 scalars.
inline __m256 minus_2u_avx2(__m256 x, __m256 x2) {
  return _mm256_mul_ps(_mm256_set1_ps(-2.0f * kSqrt2OverPi),
                       _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), x, x));
}

void gelu_tanh_block_avx2(const float* x, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j), a = minus_2u_avx2(v, _mm256_mul_ps(v, v));
    _mm256_storeu_ps(out + j, _mm256_div_ps(v, _mm256_add_ps(one, vec::exp(a))));
    for (int tail = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(kTail), _CMP_GT_OQ)); tail; tail &= tail - 1)
      out[j + __builtin_ctz(tail)] = static_cast<float>(gelu_tanh_f64(x[j + __builtin_ctz(tail)]));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(gelu_tanh_f64(x[j]));
}

void gelu_tanh_grad_block_avx2(const float* g, const float* x, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j), x2 = _mm256_mul_ps(v, v), a = minus_2u_avx2(v, x2);
    const __m256 e = vec::exp(a);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e)), one_minus_s = _mm256_mul_ps(e, s);
    const __m256 du = _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi),
                                    _mm256_fmadd_ps(_mm256_set1_ps(3 * 0.044715f), x2, one));
    const __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(v, v), s), one_minus_s), du, s);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(g + j), d));
    for (int tail = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(kTail), _CMP_GT_OQ)); tail; tail &= tail - 1) {
      const int64_t i = j + __builtin_ctz(tail);
      out[i] = static_cast<float>(g[i] * gelu_tanh_grad_f64(x[i]));
    }
  }
  for (; j < n; ++j) out[j] = static_cast<float>(g[j] * gelu_tanh_grad_f64(x[j]));
}

// exp8d's twin on 4 lanes.
inline __m256d exp4d(__m256d x) {
  x = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(-700.0)), _mm256_set1_pd(700.0));
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634074)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.9082149292705877000e-10),
                                     _mm256_fnmadd_pd(n, _mm256_set1_pd(6.9314718036912381649e-1), x));
  __m256d y = _mm256_set1_pd(1.0 / 3628800);
  for (double c : {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0})
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(c));
  const __m256i e = _mm256_slli_epi64(
      _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)), _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(y, _mm256_castsi256_pd(e));
}

void gelu_tanh_block_f64_avx2(const float* x, float* out, int64_t n) {
  const __m256d one = _mm256_set1_pd(1.0), k = _mm256_set1_pd(-2 * 0.79788456080286535588);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + j));
    const __m256d a = _mm256_mul_pd(
        k, _mm256_fmadd_pd(_mm256_mul_pd(_mm256_set1_pd(0.044715), _mm256_mul_pd(v, v)), v, v));
    _mm_storeu_ps(out + j, _mm256_cvtpd_ps(_mm256_div_pd(v, _mm256_add_pd(one, exp4d(a)))));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(gelu_tanh_f64(x[j]));
}

void gelu_tanh_grad_block_f64_avx2(const float* g, const float* x, float* out, int64_t n) {
  const __m256d one = _mm256_set1_pd(1.0), k = _mm256_set1_pd(0.79788456080286535588);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + j)), x2 = _mm256_mul_pd(v, v);
    const __m256d u = _mm256_mul_pd(k, _mm256_fmadd_pd(_mm256_mul_pd(_mm256_set1_pd(0.044715), x2), v, v));
    const __m256d e = exp4d(_mm256_mul_pd(_mm256_set1_pd(-2.0), u));
    const __m256d s = _mm256_div_pd(one, _mm256_add_pd(one, e)), one_minus_s = _mm256_mul_pd(e, s);
    const __m256d du = _mm256_mul_pd(k, _mm256_fmadd_pd(_mm256_set1_pd(3 * 0.044715), x2, one));
    const __m256d d = _mm256_fmadd_pd(_mm256_mul_pd(_mm256_mul_pd(_mm256_add_pd(v, v), s), one_minus_s), du, s);
    _mm_storeu_ps(out + j, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(g + j)), d)));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(g[j] * gelu_tanh_grad_f64(x[j]));
}

// SwiGLU's maps (the AVX2 ones below) on 16 lanes: the same polynomial, tails masked.
CASTOR_AVX512 inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, vec::exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// 16 lanes [i, i + 16) of a float32 or bfloat16 row as float32 (lanes of m; bfloat16 widened exactly, as convert
// does, by a 16-bit shift).
CASTOR_AVX512 inline __m512 load16(__mmask16 m, const float* p, int64_t i) { return _mm512_maskz_loadu_ps(m, p + i); }
CASTOR_AVX512 inline __m512 load16(__mmask16 m, const uint16_t* p, int64_t i) {
  __m256i w;
  if (m == 0xffff) {
    w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
  } else {
    alignas(32) uint16_t tail[16] = {};
    for (int k = 0; k < 16; ++k)
      if (m >> k & 1) tail[k] = p[i + k];
    w = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
  }
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16));
}

template <class T>
CASTOR_AVX512 void swiglu_block_avx512(const T* a, const T* b, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = load16(m, a, i);
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sigmoid16(x)), load16(m, b, i)));
  }
}

template <class T>
CASTOR_AVX512 void swiglu_grad_block_avx512(const T* a, const T* b, const T* g, float* da, float* db, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = load16(m, a, i), gi = load16(m, g, i), s = sigmoid16(x);
    const __m512 ds = _mm512_mul_ps(s, _mm512_fmadd_ps(x, _mm512_sub_ps(one, s), one));
    _mm512_mask_storeu_ps(da + i, m, _mm512_mul_ps(_mm512_mul_ps(gi, load16(m, b, i)), ds));
    _mm512_mask_storeu_ps(db + i, m, _mm512_mul_ps(gi, _mm512_mul_ps(x, s)));
  }
}

CASTOR_AVX512_END

bool applies(std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    if (t->dtype() != first.dtype() || !t->is_contiguous() || t->numel() != first.numel() ||
        (t->dtype() != DType::Float32 && t->dtype() != DType::BFloat16 && t->dtype() != DType::Float16))
      return false;
  return true;
}

// Elements [b, e) of t as float32: a pointer into t, or converted into buf.
const float* as_float(const Tensor& t, int64_t b, int64_t e, float* buf) {
  const char* p = static_cast<const char*>(t.data_ptr()) + b * static_cast<int64_t>(t.element_size());
  if (t.dtype() == DType::Float32) return reinterpret_cast<const float*>(p);
  convert(p, t.dtype(), buf, DType::Float32, e - b);
  return buf;
}

// Writes [b, e) of dst from float32 out (which is dst's own memory when dst is float32).
void store(const Tensor& dst, int64_t b, int64_t e, const float* out) {
  if (dst.dtype() == DType::Float32) return;
  convert(out, DType::Float32, static_cast<char*>(dst.data_ptr()) + b * static_cast<int64_t>(dst.element_size()),
          dst.dtype(), e - b);
}

float* out_ptr(const Tensor& dst, int64_t b, float* buf) {
  return dst.dtype() == DType::Float32 ? static_cast<float*>(dst.data_ptr()) + b : buf;
}

// sigmoid(x) on 8 lanes.
inline __m256 sigmoid_avx2(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, vec::exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// o = silu(a) * b = a sigmoid(a) b.
void swiglu_block_avx2(const float* a, const float* b, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid_avx2(x)), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) o[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

// da = g b sigmoid(a) (1 + a (1 - sigmoid(a))), db = g silu(a).
void swiglu_grad_block_avx2(const float* a, const float* b, const float* g, float* da, float* db, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i), gi = _mm256_loadu_ps(g + i), s = sigmoid_avx2(x);
    const __m256 ds = _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
    _mm256_storeu_ps(da + i, _mm256_mul_ps(_mm256_mul_ps(gi, _mm256_loadu_ps(b + i)), ds));
    _mm256_storeu_ps(db + i, _mm256_mul_ps(gi, _mm256_mul_ps(x, s)));
  }
  for (; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-a[i]));
    da[i] = g[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
    db[i] = g[i] * a[i] * s;
  }
}

}  // namespace

// Elements [b, ...) of a bfloat16 tensor as raw bits (the AVX-512 maps widen them in registers).
const uint16_t* bf16_bits(const Tensor& t, int64_t b) { return static_cast<const uint16_t*>(t.data_ptr()) + b; }

bool swiglu_fast(const Tensor& a, const Tensor& b, const Tensor& dst) {
  if (!applies({&a, &b, &dst}) || dst.dtype() == DType::Float32) return false;
  const bool bf16 = avx512_kernels() && a.dtype() == DType::BFloat16;
  const auto block = avx512_kernels() ? swiglu_block_avx512<float> : swiglu_block_avx2;
  parallel_blocks(dst.numel(), [&](int64_t lo, int64_t hi) {
    float ab[kBlock], bb[kBlock], ob[kBlock];
    if (bf16)
      swiglu_block_avx512(bf16_bits(a, lo), bf16_bits(b, lo), ob, hi - lo);
    else
      block(as_float(a, lo, hi, ab), as_float(b, lo, hi, bb), ob, hi - lo);
    store(dst, lo, hi, ob);
  });
  return true;
}

bool swiglu_grad_fast(const Tensor& a, const Tensor& b, const Tensor& diff_dst, const Tensor& diff_a,
                      const Tensor& diff_b) {
  if (!applies({&a, &b, &diff_dst}) || a.dtype() == DType::Float32) return false;
  for (const Tensor* t : {&diff_a, &diff_b})
    if (t->defined() && !applies({&a, t})) return false;
  const bool bf16 = avx512_kernels() && a.dtype() == DType::BFloat16;
  const auto block = avx512_kernels() ? swiglu_grad_block_avx512<float> : swiglu_grad_block_avx2;
  parallel_blocks(a.numel(), [&](int64_t lo, int64_t hi) {
    float ab[kBlock], bb[kBlock], gb[kBlock], da[kBlock], db[kBlock];
    if (bf16)
      swiglu_grad_block_avx512(bf16_bits(a, lo), bf16_bits(b, lo), bf16_bits(diff_dst, lo), da, db, hi - lo);
    else
      block(as_float(a, lo, hi, ab), as_float(b, lo, hi, bb), as_float(diff_dst, lo, hi, gb), da, db, hi - lo);
    if (diff_a.defined()) store(diff_a, lo, hi, da);
    if (diff_b.defined()) store(diff_b, lo, hi, db);
  });
  return true;
}

bool gelu_tanh_fast(const Tensor& src, const Tensor& dst) {
  if (!applies({&src, &dst})) return false;
  const bool f32 = dst.dtype() == DType::Float32;
  const auto block = avx512_kernels() ? (f32 ? gelu_tanh_block_f64 : gelu_tanh_block)
                                      : (f32 ? gelu_tanh_block_f64_avx2 : gelu_tanh_block_avx2);
  parallel_blocks(dst.numel(), [&](int64_t b, int64_t e) {
    float xb[kBlock], ob[kBlock];
    float* o = out_ptr(dst, b, ob);
    block(as_float(src, b, e, xb), o, e - b);
    store(dst, b, e, o);
  });
  return true;
}

bool gelu_tanh_grad_fast(const Tensor& diff_dst, const Tensor& src, const Tensor& diff_src) {
  if (!applies({&diff_dst, &src, &diff_src})) return false;
  // 16-bit results on float32 lanes; float32 ones on float64 lanes (exp16's 2 ulps near the derivative's zero
  // would be tens of float32 ulps of the result; rounded to 16 bits they vanish).
  const bool f32 = diff_src.dtype() == DType::Float32;
  const auto block = avx512_kernels() ? (f32 ? gelu_tanh_grad_block_f64 : gelu_tanh_grad_block)
                                      : (f32 ? gelu_tanh_grad_block_f64_avx2 : gelu_tanh_grad_block_avx2);
  parallel_blocks(diff_src.numel(), [&](int64_t b, int64_t e) {
    float gb[kBlock], xb[kBlock], ob[kBlock];
    float* o = out_ptr(diff_src, b, ob);
    block(as_float(diff_dst, b, e, gb), as_float(src, b, e, xb), o, e - b);
    store(diff_src, b, e, o);
  });
  return true;
}

}  // namespace castor::kernels
