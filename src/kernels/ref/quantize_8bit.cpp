// Block-wise 8-bit quantisation with bitsandbytes' dynamic maps, and the 8-bit AdamW update built on it.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "castor/convert.h"
#include "core/parallel.h"
#include "core/rounded_mul.h"
#include "kernels/kernels.h"

namespace castor::kernels {

namespace {

// A dynamic map and a table that finds a value's nearest code with one lookup. The floats sharing a value's top 16
// bits (sign, exponent, 7 mantissa bits) hold at most one midpoint of either map (make_map checks it), so the entry
// of those 16 bits holds the code count below the smallest of them (bits 16-23) and the low 16 bits of that
// midpoint's bits (0xffff: none), flipped for negative floats: the count is one more exactly where the value's low 16
// bits (flipped likewise) exceed them, as the floats of one sign and exponent are ordered as their bits.
struct Map {
  alignas(32) float code[256];
  std::vector<int32_t> entry;  // 65536 entries
  int32_t zero = 0;            // the code of 0 (the signed map's negative values are the codes below it)
};

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The number of midpoints below x (0 for NaN).
int32_t count_below(const float* mid, float x) {
  return static_cast<int32_t>(std::lower_bound(mid, mid + 255, x) - mid);
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i = 0..6 the
// midpoints of 2^i + 1 (unsigned: 2^(i+1) + 1) points evenly spaced over [0.1, 1], times 10^(i-6) (and negated
// when signed), then 0 and 1.
Map make_map(bool is_signed) {
  static constexpr double kScale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    for (int k = 0; k + 1 < n; ++k) {
      const double lo = 0.1 + 0.9 * k / (n - 1), hi = 0.1 + 0.9 * (k + 1) / (n - 1);
      const double v = kScale[i] * ((lo + hi) / 2.0);
      data.push_back(static_cast<float>(v));
      if (is_signed) data.push_back(static_cast<float>(-v));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  CASTOR_ASSERT(data.size() == 256, "dynamic map of ", data.size(), " values");
  std::sort(data.begin(), data.end());
  Map m;
  std::copy(data.begin(), data.end(), m.code);
  float mid[255];  // mid[k] = (code[k] + code[k + 1]) * 0.5f
  for (int k = 0; k < 255; ++k) mid[k] = (m.code[k] + m.code[k + 1]) * 0.5f;
  m.entry.resize(65536);
  for (uint32_t p = 0; p < 65536; ++p) {
    const bool negative = p >> 15;
    const float low = from_bits(negative ? p << 16 | 0xffffu : p << 16);
    const float high = from_bits(negative ? p << 16 : p << 16 | 0xffffu);
    if (std::isnan(low) || std::isnan(high)) {
      m.entry[p] = 0xffff;
      continue;
    }
    const int32_t below = count_below(mid, low), inside = count_below(mid, high) - below;
    CASTOR_ASSERT(inside <= 1, "dynamic map: ", inside, " midpoints share the top 16 bits ", p);
    uint32_t bits = 0xffff;
    if (inside == 1) {  // mid[below] in (low, high]
      std::memcpy(&bits, &mid[below], 4);
      bits = (bits & 0xffff) ^ (negative ? 0xffff : 0);
    }
    m.entry[p] = below << 16 | static_cast<int32_t>(bits);
  }
  m.zero = static_cast<int32_t>(std::find(m.code, m.code + 256, 0.0f) - m.code);
  return m;
}

const Map& map(bool is_signed) {
  static const Map maps[2] = {make_map(false), make_map(true)};
  return maps[is_signed];
}

// The nearest code of x (already divided by the absmax).
inline int32_t nearest(const Map& m, float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const int32_t e = m.entry[u >> 16];
  const int32_t low = static_cast<int32_t>((u & 0xffff) ^ (u >> 31 ? 0xffff : 0));
  return (e >> 16) + (low > (e & 0xffff));
}

// The same on 8 lanes.
inline __m256i nearest8(const Map& m, __m256 x) {
  const __m256i u = _mm256_castps_si256(x), mask = _mm256_set1_epi32(0xffff);
  const __m256i e = _mm256_i32gather_epi32(m.entry.data(), _mm256_srli_epi32(u, 16), 4);
  const __m256i low = _mm256_and_si256(_mm256_xor_si256(u, _mm256_srai_epi32(u, 31)), mask);
  const __m256i above = _mm256_cmpgt_epi32(low, _mm256_and_si256(e, mask));  // true lanes are -1
  return _mm256_sub_epi32(_mm256_srli_epi32(e, 16), above);
}

// The AVX-512 twins of quantize_block's and the update's 8-lane loops (chosen at run time: the build's baseline is
// AVX2): the same operations lane by lane, so the same codes, moments and weights; each handles the multiples of
// 16 and leaves the rest to the 8-lane loops.

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CASTOR_AVX512 __attribute__((target("avx512f")))

CASTOR_AVX512 inline __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

// quantize_block's codes of s[0, n16) (n16 a multiple of 16).
CASTOR_AVX512 void quantize16(const Map& m, bool is_signed, const float* s, int64_t n16, float a, uint8_t* codes) {
  const __m512 av = _mm512_set1_ps(a), zero = _mm512_setzero_ps();
  const __m512i nonnegative = _mm512_set1_epi32(m.zero - 1), low_bits = _mm512_set1_epi32(0xffff);
  const __m512i one = _mm512_set1_epi32(1);
  const bool any = a > 0;
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 sv = _mm512_loadu_ps(s + i);
    const __m512i u = _mm512_castps_si512(any ? _mm512_div_ps(sv, av) : zero);
    const __m512i e = _mm512_i32gather_epi32(_mm512_srli_epi32(u, 16), m.entry.data(), 4);
    const __m512i low = _mm512_and_si512(_mm512_xor_si512(u, _mm512_srai_epi32(u, 31)), low_bits);
    const __m512i count = _mm512_srli_epi32(e, 16);
    __m512i idx = _mm512_mask_add_epi32(count, _mm512_cmpgt_epi32_mask(low, _mm512_and_si512(e, low_bits)), count, one);
    if (is_signed) {
      const __mmask16 wrong = _mm512_cmp_ps_mask(sv, zero, _CMP_LT_OQ) & _mm512_cmpgt_epi32_mask(idx, nonnegative);
      idx = _mm512_mask_sub_epi32(idx, wrong, idx, one);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(idx));
  }
}

CASTOR_AVX512 inline __m512 dequantize16(const Map& m, const uint8_t* codes, __m512 absmax) {
  const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_mul_ps(_mm512_i32gather_ps(idx, m.code, 4), absmax);
}

// The update's loop over [i, i + n16) of one quantisation block starting at qb: moments into ms, vs (block
// offsets), weights written; returns the largest |m| and |v| seen in *max1, *max2.
CASTOR_AVX512 void update16(const AdamUpdate& u, const Map& m1, const Map& m2, int64_t i, int64_t n16, int64_t qb,
                            float a1, float a2, float* w, const float* g, const uint8_t* exp_avg_code,
                            const uint8_t* exp_avg_sq_code, float* ms, float* vs, float* max1, float* max2) {
  const __m512 decay = _mm512_set1_ps(u.decay_factor), neg_zero = _mm512_set1_ps(-0.0f);
  const __m512 b1 = _mm512_set1_ps(u.beta1), omb1 = _mm512_set1_ps(u.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(u.beta2), omb2 = _mm512_set1_ps(u.one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(u.bias_correction2_sqrt), eps = _mm512_set1_ps(u.eps);
  const __m512 neg_step = _mm512_set1_ps(u.neg_step_size), a1v = _mm512_set1_ps(a1), a2v = _mm512_set1_ps(a2);
  const __m512 inv = _mm512_set1_ps(u.grad_inv_scale), clip = _mm512_set1_ps(u.grad_clip);
  __m512 mx1 = _mm512_setzero_ps(), mx2 = _mm512_setzero_ps();
  for (const int64_t end = i + n16; i < end; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(g + i), inv), clip);
    const __m512 wi = u.decoupled ? _mm512_fmadd_ps(_mm512_loadu_ps(w + i), decay, neg_zero) : _mm512_loadu_ps(w + i);
    const __m512 m = _mm512_add_ps(_mm512_fmadd_ps(dequantize16(m1, exp_avg_code + i, a1v), b1, neg_zero),
                                   _mm512_fmadd_ps(gi, omb1, neg_zero));
    const __m512 v = _mm512_add_ps(_mm512_fmadd_ps(dequantize16(m2, exp_avg_sq_code + i, a2v), b2, neg_zero),
                                   _mm512_fmadd_ps(_mm512_mul_ps(omb2, gi), gi, neg_zero));
    _mm512_storeu_ps(ms + (i - qb), m);
    _mm512_storeu_ps(vs + (i - qb), v);
    mx1 = _mm512_max_ps(abs16(m), mx1);
    mx2 = _mm512_max_ps(abs16(v), mx2);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2), eps);
    _mm512_storeu_ps(w + i, _mm512_add_ps(wi, _mm512_div_ps(_mm512_mul_ps(neg_step, m), denom)));
  }
  alignas(64) float l1[16], l2[16];
  _mm512_store_ps(l1, mx1);
  _mm512_store_ps(l2, mx2);
  *max1 = *std::max_element(l1, l1 + 16);
  *max2 = *std::max_element(l2, l2 + 16);
}

#undef CASTOR_AVX512
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Codes of the n values s of one block with absmax a (a negative value of the signed map never takes a code >= 0,
// the code of 0 or above).
void quantize_block(const Map& m, bool is_signed, const float* s, int64_t n, float a, uint8_t* codes) {
  const __m256 av = _mm256_set1_ps(a), zero = _mm256_setzero_ps();
  const __m256i nonnegative = _mm256_set1_epi32(m.zero - 1);
  const bool any = a > 0;
  int64_t i = 0;
  if (avx512_kernels()) quantize16(m, is_signed, s, i = n / 16 * 16, a, codes);
  for (; i + 8 <= n; i += 8) {
    const __m256 sv = _mm256_loadu_ps(s + i);
    __m256i idx = nearest8(m, any ? _mm256_div_ps(sv, av) : zero);
    if (is_signed) {
      const __m256i wrong = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(sv, zero, _CMP_LT_OQ)),
                                             _mm256_cmpgt_epi32(idx, nonnegative));
      idx = _mm256_add_epi32(idx, wrong);  // true lanes are -1
    }
    // 8 codes of 0..255 into 8 bytes
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(idx), _mm256_extracti128_si256(idx, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(words, words));
  }
  for (; i < n; ++i) {
    int32_t idx = nearest(m, any ? s[i] / a : 0.0f);
    if (is_signed && s[i] < 0 && idx >= m.zero) --idx;
    codes[i] = static_cast<uint8_t>(idx);
  }
}

inline __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

float horizontal_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + 8);
}

// The largest |s| of n values (0 for none; NaN ignored).
float block_absmax(const float* s, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(abs8(_mm256_loadu_ps(s + i)), acc);
  float a = horizontal_max(acc);
  for (; i < n; ++i) a = std::max(a, std::fabs(s[i]));
  return a;
}

// Dequantised values of 8 codes.
inline __m256 dequantize8(const Map& m, const uint8_t* codes, __m256 absmax) {
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_mul_ps(_mm256_i32gather_ps(m.code, idx, 4), absmax);
}

}  // namespace

const float* dynamic_map(bool is_signed) { return map(is_signed).code; }

void quantize_blockwise(const float* x, int64_t n, int64_t block, bool is_signed, uint8_t* codes, float* absmax) {
  const Map& m = map(is_signed);
  parallel_blocks((n + block - 1) / block, [&](int64_t bb, int64_t be) {
    for (int64_t k = bb; k < be; ++k) {
      const int64_t b = k * block, len = std::min(n, b + block) - b;
      absmax[k] = block_absmax(x + b, len);
      quantize_block(m, is_signed, x + b, len, absmax[k], codes + b);
    }
  });
}

void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, int64_t block, bool is_signed,
                          float* out) {
  const Map& m = map(is_signed);
  parallel_blocks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = m.code[codes[i]] * absmax[i / block];
  });
}

void adamw8bit_update(const AdamUpdate& u, int64_t b, int64_t e, int64_t block, float* w, const float* g,
                      uint8_t* exp_avg_code, float* exp_avg_absmax, uint8_t* exp_avg_sq_code, float* exp_avg_sq_absmax,
                      const RoundInto& into) {
  const Map &m1 = map(true), &m2 = map(false);
  thread_local std::vector<float> buffer;
  buffer.resize(static_cast<size_t>(2 * std::min(block, e - b)));
  const __m256 decay = _mm256_set1_ps(u.decay_factor), neg_zero = _mm256_set1_ps(-0.0f);
  const __m256 b1 = _mm256_set1_ps(u.beta1), omb1 = _mm256_set1_ps(u.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(u.beta2), omb2 = _mm256_set1_ps(u.one_minus_beta2);
  const __m256 bc2 = _mm256_set1_ps(u.bias_correction2_sqrt), eps = _mm256_set1_ps(u.eps);
  const __m256 neg_step = _mm256_set1_ps(u.neg_step_size);
  const __m256 inv = _mm256_set1_ps(u.grad_inv_scale), clip = _mm256_set1_ps(u.grad_clip);
  for (int64_t qb = b; qb < e; qb += block) {
    const int64_t qe = std::min(e, qb + block), len = qe - qb, k = qb / block;
    float* ms = buffer.data();
    float* vs = ms + len;
    const float a1 = exp_avg_absmax[k], a2 = exp_avg_sq_absmax[k];
    const __m256 a1v = _mm256_set1_ps(a1), a2v = _mm256_set1_ps(a2);
    __m256 max1 = _mm256_setzero_ps(), max2 = _mm256_setzero_ps();  // the new absmaxes, lane by lane
    int64_t i = qb;
    if (avx512_kernels()) {
      float wide1, wide2;
      const int64_t n16 = len / 16 * 16;
      update16(u, m1, m2, i, n16, qb, a1, a2, w, g, exp_avg_code, exp_avg_sq_code, ms, vs, &wide1, &wide2);
      max1 = _mm256_set1_ps(wide1), max2 = _mm256_set1_ps(wide2);
      i += n16;
    }
    for (; i + 8 <= qe; i += 8) {
      const __m256 gi = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), inv), clip);
      const __m256 wi = u.decoupled ? _mm256_fmadd_ps(_mm256_loadu_ps(w + i), decay, neg_zero) : _mm256_loadu_ps(w + i);
      const __m256 m = _mm256_add_ps(_mm256_fmadd_ps(dequantize8(m1, exp_avg_code + i, a1v), b1, neg_zero),
                                     _mm256_fmadd_ps(gi, omb1, neg_zero));
      const __m256 v = _mm256_add_ps(_mm256_fmadd_ps(dequantize8(m2, exp_avg_sq_code + i, a2v), b2, neg_zero),
                                     _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, neg_zero));
      _mm256_storeu_ps(ms + (i - qb), m);
      _mm256_storeu_ps(vs + (i - qb), v);
      max1 = _mm256_max_ps(abs8(m), max1);
      max2 = _mm256_max_ps(abs8(v), max2);
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
      _mm256_storeu_ps(w + i, _mm256_add_ps(wi, _mm256_div_ps(_mm256_mul_ps(neg_step, m), denom)));
    }
    float new1 = horizontal_max(max1), new2 = horizontal_max(max2);
    for (; i < qe; ++i) {
      const float gi = g[i] * u.grad_inv_scale * u.grad_clip;
      const float wi = u.decoupled ? rounded_mul(w[i], u.decay_factor) : w[i];
      const float m = rounded_mul(m1.code[exp_avg_code[i]] * a1, u.beta1) + rounded_mul(gi, u.one_minus_beta1);
      const float v = rounded_mul(m2.code[exp_avg_sq_code[i]] * a2, u.beta2) + rounded_mul(u.one_minus_beta2 * gi, gi);
      ms[i - qb] = m;
      vs[i - qb] = v;
      new1 = std::max(new1, std::fabs(m));
      new2 = std::max(new2, std::fabs(v));
      const float denom = std::sqrt(v) / u.bias_correction2_sqrt + u.eps;
      w[i] = wi + u.neg_step_size * m / denom;
    }
    exp_avg_absmax[k] = new1;
    exp_avg_sq_absmax[k] = new2;
    quantize_block(m1, true, ms, len, exp_avg_absmax[k], exp_avg_code + qb);
    quantize_block(m2, false, vs, len, exp_avg_sq_absmax[k], exp_avg_sq_code + qb);
  }
  for (int64_t s = b; s < e; s += kBlock) round_block_into_16bit(w, into, s, std::min(e, s + kBlock));
}

}  // namespace castor::kernels
