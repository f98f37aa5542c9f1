// Internal: float32 helpers of the transformer kernels (exp, max, sums): AVX2 (the build's baseline) and AVX-512
// row kernels chosen at run time.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/avx512.h"

namespace castor::kernels::vec {

// e^x on 8 lanes: Cephes' expf (2^n e^r, r in [-ln2/2, ln2/2], degree-6 polynomial), within 2 ulp of std::exp;
// x <= -88.38 (-inf included) gives 0.
inline __m256 exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) of x (n < 8), the others `fill`.
inline __m256 load_partial(const float* x, int64_t n, float fill) {
  alignas(32) float buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = i < n ? x[i] : fill;
  return _mm256_load_ps(buf);
}

// max over x[0, n).
inline float max(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
  if (j < n) m = _mm256_max_ps(m, load_partial(x + j, n - j, -std::numeric_limits<float>::infinity()));
  return hmax(m);
}

// x[j] = e^(x[j] - shift) over [0, n); returns their sum.
inline float exp_shifted(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; j < n; ++j) sum += x[j] = std::exp(x[j] - shift);
  return sum;
}

// x[j] = e^(x[j] - shift) over [0, n) in place or, with out == nullptr, only their sum; returns the sum.
inline float sum_exp_avx2(const float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_add_ps(acc0, exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), s)));
    acc1 = _mm256_add_ps(acc1, exp(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), s)));
  }
  for (; j + 8 <= n; j += 8) acc0 = _mm256_add_ps(acc0, exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), s)));
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < n; ++j) sum += std::exp(x[j] - shift);
  return sum;
}

// out[j] = g * (e^(x[j] - lse) - off) over [0, n).
inline void softmax_grad_avx2(const float* x, int64_t n, float lse, float g, float off, float* out) {
  const __m256 l = _mm256_set1_ps(lse), gv = _mm256_set1_ps(g), o = _mm256_set1_ps(off);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(gv, _mm256_sub_ps(exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), l)), o)));
  for (; j < n; ++j) out[j] = g * (std::exp(x[j] - lse) - off);
}

// The AVX-512 twins (16 lanes, the same polynomial).
CASTOR_AVX512_BEGIN

CASTOR_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-88.3762626647949f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
}

// Horizontal max and sum of 16 lanes (GCC 12's _mm512_reduce_* raise -Wuninitialized; once per chunk, so plain).
CASTOR_AVX512 inline float hmax16(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  return *std::max_element(l, l + 16);
}
CASTOR_AVX512 inline float hsum16(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float s = 0;
  for (float x : l) s += x;
  return s;
}

CASTOR_AVX512 inline float max_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  if (j < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(neg_inf, static_cast<__mmask16>((1u << (n - j)) - 1), x + j));
  return hmax16(m);
}

CASTOR_AVX512 inline float sum_exp_avx512(const float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    acc0 = _mm512_add_ps(acc0, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s)));
    acc1 = _mm512_add_ps(acc1, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), s)));
  }
  for (; j + 16 <= n; j += 16) acc0 = _mm512_add_ps(acc0, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s)));
  float sum = hsum16(_mm512_add_ps(acc0, acc1));
  for (; j < n; ++j) sum += std::exp(x[j] - shift);
  return sum;
}

CASTOR_AVX512 inline void softmax_grad_avx512(const float* x, int64_t n, float lse, float g, float off, float* out) {
  const __m512 l = _mm512_set1_ps(lse), gv = _mm512_set1_ps(g), o = _mm512_set1_ps(off);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm512_storeu_ps(out + j, _mm512_mul_ps(gv, _mm512_sub_ps(exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), l)), o)));
  for (; j < n; ++j) out[j] = g * (std::exp(x[j] - lse) - off);
}

CASTOR_AVX512_END

}  // namespace castor::kernels::vec
