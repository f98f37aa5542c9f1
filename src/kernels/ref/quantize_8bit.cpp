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
#include "kernels/cpu/avx512.h"
#include "kernels/kernels.h"

namespace castor::kernels {

namespace {

// A dynamic map and a table that finds a value's nearest code with one lookup. The floats sharing a value's top 16
// bits (sign, exponent, 7 mantissa bits) hold at most one midpoint of either map (make_map checks it), so the entry
// of those 16 bits holds the code count below the smallest of them (bits 16-23) and the low 16 bits of that
// midpoint's bits (0xffff: none), flipped for negative floats: the count is one more exactly where the value's low 16
// bits (flipped likewise) exceed them, as the floats of one sign and exponent are ordered as their bits.
//
// The same count without the table (codes16, for x in [-1, 1] or NaN, as x = s / absmax is): the map's positive
// values are 0, seven decades i = 0..6 of N_i codes each (N_i = 2^i signed, 2^(i+1) unsigned; the codes from
// first_i), 10^(i-6) (0.1 + 0.9 (k + 0.5) / N_i), and 1. A positive y lies in one of nine territories d bounded by
// the midpoints beside the decades (d = 0 nearer 0, d = i + 1 decade i, d = 8 nearer 1); a binade of y holds at
// most one such bound (split), so d is the count of bounds below y's binade plus one compare. Inside decade i the
// midpoints between its codes lie near the integers 1 .. N_i - 1 of (y 10^(6-i) - 0.1) N_i / 0.9, so
// t = fma(y, scale, -offset) = that + first_i - zero + kUnsure puts the k-th of them within kUnsure / 2 of
// first_i - zero + k + kUnsure (make_map checks each), and as t grows with y, floor(min(t, top)) counts the positive
// midpoints below y wherever frac(t) >= 2 kUnsure; the lanes with frac(t) < 2 kUnsure (about 0.05%) or NaN take
// the table. A negative x of the signed map counts the positive midpoints at or below |x| instead: the same count
// but at a midpoint, which is such a lane (the bounds above decades 0..5 lie at integers of the t below them too,
// make_map checks it), or at the bound of 0 or the one of 1, where the clamps to 1 .. zero give the same code.
struct Map {
  alignas(64) float code[256];
  std::vector<int32_t> entry;  // 65536 entries
  int32_t zero = 0;            // the code of 0 (the signed map's negative values are the codes below it)
  // codes16's tables: per binade [2^(E-127), 2^(E-126)) of y at E % 32, for E = 104..127 (y below 2^-23 taken as
  // 2^-23, in territory 0)
  alignas(64) float split[32];                       // the territory bound inside it, or +inf
  alignas(64) int32_t before[32];                    // the territory bounds below it
  alignas(64) float scale[16], offset[16], top[16];  // per territory (0 and 8: t = the count + 0.5)
  alignas(64) uint8_t plane[4][256];                 // byte b of code[c] at plane[b][c] (dequantize64)
};

// Lanes whose t lies in [k, k + 2 kUnsure) for an integer k take the table (the map's midpoints lie within 2e-5 of
// their k + kUnsure).
constexpr float kUnsure = 1.0f / 4096;

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
  // codes16's tables
  const int32_t z = m.zero;
  int32_t first[8];
  first[0] = z + 1;
  for (int i = 0; i < 7; ++i) first[i + 1] = first[i] + (is_signed ? 1 << i : 2 << i);
  CASTOR_ASSERT(first[7] == 255, "dynamic map: decades end at ", first[7]);
  float bound[8];  // the midpoint below decade i (i = 0..6), and the one between the last decade and 1
  for (int i = 0; i < 8; ++i) bound[i] = mid[first[i] - 1];
  CASTOR_ASSERT(bound[0] >= std::ldexp(1.0f, -23), "dynamic map: a midpoint below 2^-23");
  for (int e = 104; e < 136; ++e) {
    const float lo = std::ldexp(1.0f, e - 127), hi = std::ldexp(1.0f, e - 126);
    m.split[e % 32] = INFINITY;
    m.before[e % 32] = 0;
    for (float b : bound) {
      if (b < lo) ++m.before[e % 32];
      if (b >= lo && b < hi) {
        CASTOR_ASSERT(m.split[e % 32] == INFINITY, "dynamic map: two decade bounds in one binade");
        m.split[e % 32] = b;
      }
    }
  }
  for (int d = 0; d < 16; ++d) {  // territories 0 and 8 (and the unused ones)
    const float count = d == 0 ? 0.0f : static_cast<float>(255 - z);
    m.scale[d] = 0.0f;
    m.offset[d] = -(count + 0.5f);
    m.top[d] = count + 0.5f;
  }
  for (int i = 0; i < 7; ++i) {
    const int32_t n = first[i + 1] - first[i], below = first[i] - z;
    const float scale = m.scale[i + 1] = static_cast<float>(std::pow(10.0, 6 - i) * n / 0.9);
    const float offset = m.offset[i + 1] = static_cast<float>(n / 9.0 - below - kUnsure);
    m.top[i + 1] = static_cast<float>(below + n - 1) + 0.5f;
    CASTOR_ASSERT(std::fma(bound[i], scale, -offset) >= static_cast<float>(below), "dynamic map: decade ", i,
                  " starts below its count");
    if (i < 6) {  // the bound above the decade (checked as a tie of negative values needs it to be unsure)
      const float t = std::fma(bound[i + 1], scale, -offset);
      CASTOR_ASSERT(std::fabs(t - static_cast<float>(below + n + 1) - kUnsure) < kUnsure / 2, "dynamic map: bound ",
                    i + 1, " at t = ", t);
    }
    for (int32_t k = 1; k < n; ++k) {  // the midpoint above the decade's code k - 1
      const float t = std::fma(mid[first[i] + k - 1], scale, -offset);
      CASTOR_ASSERT(std::fabs(t - static_cast<float>(below + k) - kUnsure) < kUnsure / 2, "dynamic map: midpoint ", k,
                    " of decade ", i, " at t = ", t);
    }
  }
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 256; ++c) {
      uint32_t bits;
      std::memcpy(&bits, &m.code[c], 4);
      m.plane[b][c] = static_cast<uint8_t>(bits >> (8 * b));
    }
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

CASTOR_AVX512_BEGIN
#define CASTOR_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

CASTOR_AVX512 inline __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

// nearest()'s counts on 16 lanes through the table, for the lanes in `lanes` (the others keep `count`).
CASTOR_AVX512 inline __m512i nearest_lookup16(const Map& m, __m512i u, __mmask16 lanes, __m512i count) {
  const __m512i low_bits = _mm512_set1_epi32(0xffff);
  const __m512i e = _mm512_mask_i32gather_epi32(count, lanes, _mm512_srli_epi32(u, 16), m.entry.data(), 4);
  const __m512i low = _mm512_and_si512(_mm512_xor_si512(u, _mm512_srai_epi32(u, 31)), low_bits);
  const __m512i below = _mm512_srli_epi32(e, 16);
  const __mmask16 above = _mm512_cmpgt_epi32_mask(low, _mm512_and_si512(e, low_bits));
  return _mm512_mask_mov_epi32(count, lanes, _mm512_mask_add_epi32(below, above, below, _mm512_set1_epi32(1)));
}

// quantize_block's codes of 16 values s with x = s / absmax (in [-1, 1] or NaN): the count of midpoints below x
// without the table (the struct Map's comment) but for the unsure lanes; a negative s of the signed map keeps a code
// below the code of 0.
template <bool kSigned>
CASTOR_AVX512 inline __m512i codes16(const Map& m, __m512 x, __m512 s) {
  const __m512i one = _mm512_set1_epi32(1), z = _mm512_set1_epi32(m.zero);
  // unsigned: a negative x as y = 2^-23, count 0; NaN stays NaN
  const __m512 y = _mm512_max_ps(_mm512_set1_ps(0x1p-23f), kSigned ? abs16(x) : x);
  const __m512i e = _mm512_srli_epi32(_mm512_castps_si512(y), 23);  // the binade tables take e % 32
  const __m512 split = _mm512_permutex2var_ps(_mm512_load_ps(m.split), e, _mm512_load_ps(m.split + 16));
  __m512i d = _mm512_permutex2var_epi32(_mm512_load_si512(m.before), e, _mm512_load_si512(m.before + 16));
  d = _mm512_mask_add_epi32(d, _mm512_cmp_ps_mask(y, split, _CMP_GT_OQ), d, one);
  const __m512 t = _mm512_fmsub_ps(y, _mm512_permutexvar_ps(d, _mm512_load_ps(m.scale)),
                                   _mm512_permutexvar_ps(d, _mm512_load_ps(m.offset)));
  const __m512 frac = _mm512_sub_ps(t, _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  __mmask16 unsure = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(2 * kUnsure), _CMP_NGE_UQ);  // NaN too
  __m512i count = _mm512_cvttps_epi32(_mm512_min_ps(t, _mm512_permutexvar_ps(d, _mm512_load_ps(m.top))));
  __mmask16 negative = 0;
  if (kSigned) {
    // a negative s: the code of 0 less the positive midpoints at or below |x|, and at least one less
    negative = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_LT_OQ);
    count = _mm512_mask_sub_epi32(_mm512_add_epi32(z, count), negative, z,
                                  _mm512_min_epi32(_mm512_max_epi32(count, one), z));
  }
  if (!unsure) return count;
  count = nearest_lookup16(m, _mm512_castps_si512(x), unsure, count);
  return kSigned ? _mm512_mask_sub_epi32(count, unsure & negative & _mm512_cmpge_epi32_mask(count, z), count, one)
                 : count;
}

// quantize_block's codes of s[0, n16) (n16 a multiple of 16).
template <bool kSigned>
CASTOR_AVX512 void quantize16(const Map& m, const float* s, int64_t n16, float a, uint8_t* codes) {
  const __m512 av = _mm512_set1_ps(a), zero = _mm512_setzero_ps();
  const bool any = a > 0;
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 sv = _mm512_loadu_ps(s + i);
    const __m512i idx = codes16<kSigned>(m, any ? _mm512_div_ps(sv, av) : zero, sv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(idx));
  }
}

CASTOR_AVX512 inline __m512 dequantize16(const Map& m, const uint8_t* codes) {
  const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_i32gather_ps(idx, m.code, 4);
}

// The map's values of 64 codes without gathers: a byte plane of the 256 values picked by two vpermi2b and a blend,
// four planes interleaved into floats. out[q] lane l: code[codes[16 q + l]].
CASTOR_VBMI inline void dequantize64(const Map& m, const uint8_t* codes, __m512 out[4]) {
  // the codes reordered so that the interleaves give the lanes in order: byte 16 l + 4 q + k (l, q, k < 4) of the
  // reordered codes lands in out[q] lane 4 l + k
  static constexpr auto kOrder = [] {
    std::array<uint8_t, 64> o{};
    for (int l = 0; l < 4; ++l)
      for (int q = 0; q < 4; ++q)
        for (int k = 0; k < 4; ++k) o[16 * l + 4 * q + k] = static_cast<uint8_t>(16 * q + 4 * l + k);
    return o;
  }();
  const __m512i c = _mm512_permutexvar_epi8(_mm512_loadu_si512(kOrder.data()), _mm512_loadu_si512(codes));
  const __mmask64 high = _mm512_movepi8_mask(c);  // codes 128..255
  __m512i p[4];
  for (int b = 0; b < 4; ++b) {
    const uint8_t* t = m.plane[b];
    p[b] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(_mm512_load_si512(t), c, _mm512_load_si512(t + 64)),
                                  _mm512_permutex2var_epi8(_mm512_load_si512(t + 128), c, _mm512_load_si512(t + 192)));
  }
  const __m512i lo01 = _mm512_unpacklo_epi8(p[0], p[1]), hi01 = _mm512_unpackhi_epi8(p[0], p[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(p[2], p[3]), hi23 = _mm512_unpackhi_epi8(p[2], p[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23));
}

// The update's constants on 16 lanes, and the largest |m| and |v| so far.
struct Adam16 {
  __m512 decay, neg_zero, b1, omb1, b2, omb2, bc2, eps, neg_step, a1, a2, inv, clip;
  __m512 max1, max2;
  bool decoupled;
};

CASTOR_AVX512 inline Adam16 adam16(const AdamUpdate& u, float a1, float a2) {
  return {_mm512_set1_ps(u.decay_factor),
          _mm512_set1_ps(-0.0f),
          _mm512_set1_ps(u.beta1),
          _mm512_set1_ps(u.one_minus_beta1),
          _mm512_set1_ps(u.beta2),
          _mm512_set1_ps(u.one_minus_beta2),
          _mm512_set1_ps(u.bias_correction2_sqrt),
          _mm512_set1_ps(u.eps),
          _mm512_set1_ps(u.neg_step_size),
          _mm512_set1_ps(a1),
          _mm512_set1_ps(a2),
          _mm512_set1_ps(u.grad_inv_scale),
          _mm512_set1_ps(u.grad_clip),
          _mm512_setzero_ps(),
          _mm512_setzero_ps(),
          u.decoupled};
}

// The update of elements [i, i + 16) from the map values of their codes: m and v into ms, vs at i - qb, w written.
CASTOR_AVX512 inline void adam_lanes16(Adam16& k, int64_t i, int64_t qb, __m512 code1, __m512 code2, float* w,
                                       const float* g, float* ms, float* vs) {
  const __m512 gi = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(g + i), k.inv), k.clip);
  const __m512 wi = k.decoupled ? _mm512_fmadd_ps(_mm512_loadu_ps(w + i), k.decay, k.neg_zero) : _mm512_loadu_ps(w + i);
  const __m512 m = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(code1, k.a1), k.b1, k.neg_zero),
                                 _mm512_fmadd_ps(gi, k.omb1, k.neg_zero));
  const __m512 v = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(code2, k.a2), k.b2, k.neg_zero),
                                 _mm512_fmadd_ps(_mm512_mul_ps(k.omb2, gi), gi, k.neg_zero));
  _mm512_storeu_ps(ms + (i - qb), m);
  _mm512_storeu_ps(vs + (i - qb), v);
  k.max1 = _mm512_max_ps(abs16(m), k.max1);
  k.max2 = _mm512_max_ps(abs16(v), k.max2);
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), k.bc2), k.eps);
  _mm512_storeu_ps(w + i, _mm512_add_ps(wi, _mm512_div_ps(_mm512_mul_ps(k.neg_step, m), denom)));
}

CASTOR_AVX512 inline void horizontal_max16(const Adam16& k, float* max1, float* max2) {
  alignas(64) float l1[16], l2[16];
  _mm512_store_ps(l1, k.max1);
  _mm512_store_ps(l2, k.max2);
  *max1 = *std::max_element(l1, l1 + 16);
  *max2 = *std::max_element(l2, l2 + 16);
}

// The elements 1024 ahead of i (64 of them: w, g and both codes) fetched into the cache: the update's pass over a
// block then finds them there after the block's quantisation, which reads no memory (a single-thread step over 16M
// elements: 1.15 -> 0.80 ns per element on the AVX-512 loops, 2.3 -> 2.2 on the AVX2 ones).
constexpr int64_t kAhead = 1024;
inline void prefetch(const void* p) {  // (GCC's dead-code pass deletes _mm_prefetch here: an asm it keeps)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}
inline void prefetch_ahead(int64_t i, const float* w, const float* g, const uint8_t* code1, const uint8_t* code2) {
  for (int l = 0; l < 64; l += 16) {
    prefetch(w + i + kAhead + l);
    prefetch(g + i + kAhead + l);
  }
  prefetch(code1 + i + kAhead);
  prefetch(code2 + i + kAhead);
}

// The update's loop over [i, i + n16) of one quantisation block starting at qb: moments into ms, vs (block
// offsets), weights written; returns the largest |m| and |v| seen in *max1, *max2.
CASTOR_AVX512 void update16(const AdamUpdate& u, const Map& m1, const Map& m2, int64_t i, int64_t n16, int64_t qb,
                            float a1, float a2, float* w, const float* g, const uint8_t* exp_avg_code,
                            const uint8_t* exp_avg_sq_code, float* ms, float* vs, float* max1, float* max2) {
  Adam16 k = adam16(u, a1, a2);
  for (const int64_t end = i + n16; i < end; i += 16) {
    if ((i - qb) % 64 == 0) prefetch_ahead(i, w, g, exp_avg_code, exp_avg_sq_code);
    adam_lanes16(k, i, qb, dequantize16(m1, exp_avg_code + i), dequantize16(m2, exp_avg_sq_code + i), w, g, ms, vs);
  }
  horizontal_max16(k, max1, max2);
}

// update16 with the codes decoded 64 at a time by dequantize64.
CASTOR_VBMI void update64(const AdamUpdate& u, const Map& m1, const Map& m2, int64_t i, int64_t n16, int64_t qb,
                          float a1, float a2, float* w, const float* g, const uint8_t* exp_avg_code,
                          const uint8_t* exp_avg_sq_code, float* ms, float* vs, float* max1, float* max2) {
  Adam16 k = adam16(u, a1, a2);
  const int64_t end = i + n16;
  for (; i + 64 <= end; i += 64) {
    __m512 c1[4], c2[4];
    prefetch_ahead(i, w, g, exp_avg_code, exp_avg_sq_code);
    dequantize64(m1, exp_avg_code + i, c1);
    dequantize64(m2, exp_avg_sq_code + i, c2);
    for (int q = 0; q < 4; ++q) adam_lanes16(k, i + 16 * q, qb, c1[q], c2[q], w, g, ms, vs);
  }
  for (; i < end; i += 16)
    adam_lanes16(k, i, qb, dequantize16(m1, exp_avg_code + i), dequantize16(m2, exp_avg_sq_code + i), w, g, ms, vs);
  horizontal_max16(k, max1, max2);
}

#undef CASTOR_VBMI
CASTOR_AVX512_END

// Codes of the n values s of one block with absmax a (a negative value of the signed map never takes a code >= 0,
// the code of 0 or above).
void quantize_block(const Map& m, bool is_signed, const float* s, int64_t n, float a, uint8_t* codes) {
  const __m256 av = _mm256_set1_ps(a), zero = _mm256_setzero_ps();
  const __m256i nonnegative = _mm256_set1_epi32(m.zero - 1);
  const bool any = a > 0;
  int64_t i = 0;
  if (avx512_kernels()) (is_signed ? quantize16<true> : quantize16<false>)(m, s, i = n / 16 * 16, a, codes);
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
      (avx512_vbmi_kernels() ? update64 : update16)(u, m1, m2, i, n16, qb, a1, a2, w, g, exp_avg_code, exp_avg_sq_code,
                                                    ms, vs, &wide1, &wide2);
      max1 = _mm256_set1_ps(wide1), max2 = _mm256_set1_ps(wide2);
      i += n16;
    }
    for (; i + 8 <= qe; i += 8) {
      if ((i - qb) % 64 == 0) prefetch_ahead(i, w, g, exp_avg_code, exp_avg_sq_code);
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
