// The block-type table (castor/quant.h): GGUF's block layouts with ggml's reference quantizers, bitsandbytes' NF4
// with QLoRA's double quantization, and frozen matrices stored in them. Compiled without floating-point contraction
// (CMakeLists.txt): ggml rounds each product of `d * q - m` on its own, and so must the dequantizers here.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "castor/check.h"
#include "castor/convert.h"
#include "castor/half.h"
#include "castor/quant.h"
#include "kernels/cpu/dequantize_bf16.h"
#include "kernels/kernels.h"

namespace castor::quant {

namespace {

constexpr int kQK = 256;  // values per K-quant super-block

float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_bits_to_float(h);
}
void put_f16(uint8_t* p, float v) {
  const uint16_t h = float_to_half_bits(v);
  std::memcpy(p, &h, 2);
}
// ggml's rounding helper: round half to even through the float adder (1.5 * 2^23 shifts the integer into the low
// mantissa bits); defined for every float (garbage, as ggml's, far out of range).
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}
float absmax_signed(const float* x, int n) {  // the value of largest magnitude (the first of equals), with its sign
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  return max;
}
float min_of(const float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = std::min(m, x[i]);
  return m;
}

// ---- plain floats
void deq_f32(const uint8_t* b, float* y, int64_t n) { std::memcpy(y, b, static_cast<size_t>(n) * 4); }
void q_f32(const float* x, uint8_t* b, int64_t n) { std::memcpy(b, x, static_cast<size_t>(n) * 4); }
void deq_f16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16(b + 2 * i);
}
void q_f16(const float* x, uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) put_f16(b + 2 * i, x[i]);
}
void deq_bf16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, b + 2 * i, 2);
    y[i] = bf16_bits_to_float(h);
  }
}
void q_bf16(const float* x, uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = float_to_bf16_bits(x[i]);
    std::memcpy(b + 2 * i, &h, 2);
  }
}

// ---- 32-value blocks. Q4_0 {half d; u8 qs[16]}, Q4_1 {half d, m; u8 qs[16]}, Q5_0 {half d; u8 qh[4]; u8 qs[16]},
// Q5_1 {half d, m; u8 qh[4]; u8 qs[16]}, Q8_0 {half d; i8 qs[32]}. Byte j of qs: value j low, value j + 16 high;
// bit j of qh: the fifth bit of value j.
template <int Bits, bool Min>
void deq_legacy(const uint8_t* b, float* y, int64_t n) {
  constexpr int64_t bytes = 2 + (Min ? 2 : 0) + (Bits == 5 ? 4 : 0) + 16;
  constexpr int offset = Min ? 0 : 1 << (Bits - 1);
  for (int64_t k = 0; k < n / 32; ++k, b += bytes, y += 32) {
    const float d = f16(b), m = Min ? f16(b + 2) : 0.0f;
    uint32_t qh = 0;
    if (Bits == 5) std::memcpy(&qh, b + (Min ? 4 : 2), 4);
    const uint8_t* qs = b + bytes - 16;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 15) | (Bits == 5 ? ((qh >> j) & 1) << 4 : 0);
      const int hi = (qs[j] >> 4) | (Bits == 5 ? ((qh >> (j + 16)) & 1) << 4 : 0);
      y[j] = Min ? static_cast<float>(lo) * d + m : static_cast<float>(lo - offset) * d;
      y[j + 16] = Min ? static_cast<float>(hi) * d + m : static_cast<float>(hi - offset) * d;
    }
  }
}
// Symmetric types: d = (the value of largest magnitude) / -2^(Bits-1), q = min(2^Bits - 1, trunc(x / d + 2^(Bits-1)
// + 0.5)). With a min: d = (max - min) / (2^Bits - 1), q = trunc((x - min) / d + 0.5).
template <int Bits, bool Min>
void q_legacy(const float* x, uint8_t* b, int64_t n) {
  constexpr int64_t bytes = 2 + (Min ? 2 : 0) + (Bits == 5 ? 4 : 0) + 16;
  constexpr int top = (1 << Bits) - 1;
  for (int64_t k = 0; k < n / 32; ++k, b += bytes, x += 32) {
    float d, m = 0;
    if (Min) {
      m = min_of(x, 32);
      d = (*std::max_element(x, x + 32) - m) / static_cast<float>(top);
    } else {
      d = absmax_signed(x, 32) / -static_cast<float>(1 << (Bits - 1));
    }
    const float id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(b, d);
    if (Min) put_f16(b + 2, m);
    uint32_t qh = 0;
    uint8_t* qs = b + bytes - 16;
    auto code = [&](float v) {
      if (Min) return std::min(top, static_cast<int>((v - m) * id + 0.5f));
      return std::min(top,
                      static_cast<int>(static_cast<int8_t>(v * id + (static_cast<float>(1 << (Bits - 1)) + 0.5f))));
    };
    for (int j = 0; j < 16; ++j) {
      const int lo = code(x[j]), hi = code(x[j + 16]);
      qs[j] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      qh |= static_cast<uint32_t>((lo >> 4) & 1) << j | static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
    }
    if (Bits == 5) std::memcpy(b + (Min ? 4 : 2), &qh, 4);
  }
}
void deq_q8_0(const uint8_t* b, float* y, int64_t n) {
  for (int64_t k = 0; k < n / 32; ++k, b += 34, y += 32) {
    const float d = f16(b);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}
void q_q8_0(const float* x, uint8_t* b, int64_t n) {  // d = max|x| / 127, q = round(x / d) (half away from zero)
  for (int64_t k = 0; k < n / 32; ++k, b += 34, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

// ---- K-quant scale searches (ggml-quants.c's make_qx_quants, make_q3_quants, make_qkx2_quants), written anew.

// Symmetric levels l in [-nmax, nmax) with weights x^2: the scale of the best weighted least-squares fit over 19
// trial inverse scales -(nmax + 0.1 t) / max, t = -9..9 (t = 0 the first); L gets l + nmax.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  const float max = absmax_signed(x, n);
  if (std::fabs(max) < 1e-15f) {
    std::fill(L, L + n, 0);
    return 0;
  }
  auto level = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))); };
  auto sums = [&](float iscale, float& sumlx, float& suml2) {
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(level(iscale, i)), w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
  };
  float iscale = -static_cast<float>(nmax) / max, sumlx, suml2;
  sums(iscale, sumlx, suml2);
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(iscale, i) + nmax);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int t = -9; t <= 9; ++t) {
    if (t == 0) continue;
    const float is = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(t)) / max;
    sums(is, sumlx, suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(is, i) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's: levels in [-nmax, nmax) from -nmax / max, then up to five sweeps moving single levels to the optimum of
// the rest where that raises the weighted (x^2) fit; L gets l + nmax.
float fit_symmetric_sweeps(int n, int nmax, const float* x, int8_t* L) {
  const float max = absmax_signed(x, n);
  if (std::fabs(max) < 1e-15f) {
    std::fill(L, L + n, 0);
    return 0;
  }
  const float iscale = -static_cast<float>(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i], li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx <= 0) continue;
      float sl2 = suml2 - w * li * li;
      const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(x[i] * sl2 / slx)));
      if (l == L[i]) continue;
      slx += w * x[i] * static_cast<float>(l);
      sl2 += w * static_cast<float>(l) * static_cast<float>(l);
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<int8_t>(l);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

// Asymmetric levels l in [0, nmax] with x ~ scale l - the_min (the_min >= 0): start from the range [min(x, 0), max],
// then try inverse scales (rmin + rdelta t + nmax) / range, t = 0..nstep, each with the weighted least-squares scale
// and offset of its levels, keeping the one of least weighted error (squared, or absolute with mad).
float fit_affine(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, float rmin,
                 float rdelta, int nstep, bool mad) {
  float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *the_min = -min;
    return 0;
  }
  auto error = [&](float scale, float offset, const uint8_t* levels) {
    float e = 0;
    for (int i = 0; i < n; ++i) {
      float diff = scale * static_cast<float>(levels[i]) + offset - x[i];
      diff = mad ? std::fabs(diff) : diff * diff;
      e += weights[i] * diff;
    }
    return e;
  };
  float iscale = static_cast<float>(nmax) / (max - min), scale = 1 / iscale;
  for (int i = 0; i < n; ++i)
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min)))));
  float best = error(scale, min, L);
  std::array<uint8_t, 32> trial;
  for (int t = 0; t <= nstep; ++t) {
    iscale = (rmin + rdelta * static_cast<float>(t) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      trial[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l), w = weights[i];
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    const float e = error(this_scale, this_min, trial.data());
    if (e < best) {
      std::copy(trial.begin(), trial.begin() + n, L);
      best = e;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

// Q3_K's and Q6_K's 16 sub-blocks of 16 values, each fitted by `fit` (levels into L, scales into `scales`): the scale
// of largest magnitude, with its sign.
template <class Fit>
float fit_sub_blocks(Fit fit, int nmax, const float* x, int8_t* L, float* scales) {
  float amax = 0, max_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit(16, nmax, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > amax) amax = std::fabs(scales[j]), max_scale = scales[j];
  }
  return max_scale;
}

// 2-bit values of 256 in 64 bytes: byte 32 c + l holds values 128 c + l + 32 s at bits 2 s (Q2_K's and Q3_K's qs).
void pack2(const uint8_t* L, uint8_t* qs) {
  for (int c = 0; c < 2; ++c)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * c + l;
      qs[32 * c + l] = static_cast<uint8_t>(v[0] | v[32] << 2 | v[64] << 4 | v[96] << 6);
    }
}
int unpack2(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

// ---- Q2_K {u8 scales[16] (scale low nibble, min high); u8 qs[64]; half d, dmin}: x = d sc q - dmin m per 16.
void deq_q2_k(const uint8_t* b, float* y, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 84, y += kQK) {
    const float d = f16(b + 80), dmin = f16(b + 82);
    for (int e = 0; e < kQK; ++e) {
      const uint8_t sc = b[e / 16];
      const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>(unpack2(b + 16, e)) - ml;
    }
  }
}
void q_q2_k(const float* x, uint8_t* b, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 84, x += kQK) {
    uint8_t L[kQK];
    float scales[16], mins[16], weights[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    uint8_t* sc = b;
    std::fill(sc, sc + 16, 0);
    if (max_scale > 0) {
      const float is = 15.0f / max_scale;
      for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(nearest_int(is * scales[j]));
    }
    put_f16(b + 80, max_scale > 0 ? max_scale / 15.0f : 0.0f);
    if (max_min > 0) {
      const float is = 15.0f / max_min;
      for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(sc[j] | nearest_int(is * mins[j]) << 4);
    }
    put_f16(b + 82, max_min > 0 ? max_min / 15.0f : 0.0f);
    const float d = f16(b + 80), dmin = f16(b + 82);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * static_cast<float>(sc[j] & 15);
      if (dl == 0) continue;
      const float ml = dmin * static_cast<float>(sc[j] >> 4);
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<uint8_t>(std::max(0, std::min(3, nearest_int((x[16 * j + i] + ml) / dl))));
    }
    pack2(L, b + 16);
  }
}

// ---- Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}: 16 six-bit scales (s + 32: low nibbles in bytes
// 0-7, value j >= 8 in the high nibble of j - 8; the top two bits of scale j at bits 2 (j / 4) of byte 8 + j % 4);
// value e = d (s - 32) (q - 4 unless bit e / 32 of hmask[e % 32]).
int q3_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
  return (low | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
}
void deq_q3_k(const uint8_t* b, float* y, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 110, y += kQK) {
    const float d = f16(b + 108);
    for (int e = 0; e < kQK; ++e) {
      const float dl = d * static_cast<float>(q3_scale(b + 96, e / 16));
      const int high = (b[e % 32] >> (e / 32)) & 1;
      y[e] = dl * static_cast<float>(unpack2(b + 32, e) - (high ? 0 : 4));
    }
  }
}
void q_q3_k(const float* x, uint8_t* b, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 110, x += kQK) {
    int8_t L[kQK];
    float scales[16];
    const float max_scale = fit_sub_blocks(fit_symmetric_sweeps, 4, x, L, scales);
    uint8_t* s = b + 96;
    std::fill(s, s + 12, 0);
    if (max_scale != 0) {
      const float is = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = std::max(-32, std::min(31, static_cast<int>(static_cast<int8_t>(nearest_int(is * scales[j]))))) +
                      32;
        if (j < 8)
          s[j] = static_cast<uint8_t>(l & 15);
        else
          s[j - 8] = static_cast<uint8_t>(s[j - 8] | (l & 15) << 4);
        s[8 + j % 4] = static_cast<uint8_t>(s[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
      }
      put_f16(b + 108, 1 / is);
    } else {
      put_f16(b + 108, 0.0f);
    }
    const float d = f16(b + 108);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * static_cast<float>(q3_scale(s, j));
      if (dl == 0) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<int8_t>(std::max(-4, std::min(3, nearest_int(x[16 * j + i] / dl))) + 4);
    }
    uint8_t low[kQK];
    std::fill(b, b + 32, 0);
    for (int e = 0; e < kQK; ++e) {
      if (L[e] > 3) b[e % 32] = static_cast<uint8_t>(b[e % 32] | 1 << (e / 32));
      low[e] = static_cast<uint8_t>(L[e] > 3 ? L[e] - 4 : L[e]);
    }
    pack2(low, b + 32);
  }
}

// ---- Q4_K {half d, dmin; u8 scales[12]; u8 qs[128]} and Q5_K (qh[32] before qs): 8 six-bit scales and mins per
// 32 values (get_scale_min_k4's packing); x = d sc q - dmin m. qs: 64-value chunk c in bytes 32 c.., its first 32
// values in the low nibbles; Q5_K's fifth bit of value 64 c + l (+ 32) at bit 2 c (+ 1) of qh[l].
void scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}
template <int Bits>
void deq_qk(const uint8_t* b, float* y, int64_t n) {
  constexpr int64_t bytes = Bits == 4 ? 144 : 176;
  for (int64_t k = 0; k < n / kQK; ++k, b += bytes, y += kQK) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *qh = b + 16, *qs = b + bytes - 128;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min(b + 4, j, sc, m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
        if (Bits == 5) q += (qh[l] >> j) & 1 ? 16 : 0;
        y[32 * j + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}
template <int Bits>
void q_qk(const float* x, uint8_t* b, int64_t n) {
  constexpr int64_t bytes = Bits == 4 ? 144 : 176;
  constexpr int nmax = (1 << Bits) - 1;
  for (int64_t k = 0; k < n / kQK; ++k, b += bytes, x += kQK) {
    uint8_t L[kQK];
    float scales[8], mins[8], weights[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* v = x + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += v[l] * v[l];
      const float av = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av + std::fabs(v[l]);
      scales[j] = Bits == 4 ? fit_affine(32, nmax, v, weights, L + 32 * j, &mins[j], -1.0f, 0.1f, 20, false)
                            : fit_affine(32, nmax, v, weights, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* s = b + 4;
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
      if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
      } else {
        s[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
        s[j - 4] = static_cast<uint8_t>(s[j - 4] | (ls >> 4) << 6);
        s[j] = static_cast<uint8_t>(s[j] | (lm >> 4) << 6);
      }
    }
    put_f16(b, max_scale / 63.0f);
    put_f16(b + 2, max_min / 63.0f);
    const float d = f16(b), dmin = f16(b + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min(s, j, sc, m);
      const float dl = d * static_cast<float>(sc);
      if (dl == 0) continue;
      const float ml = dmin * static_cast<float>(m);
      for (int i = 0; i < 32; ++i)
        L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int((x[32 * j + i] + ml) / dl))));
    }
    uint8_t *qh = b + 16, *qs = b + bytes - 128;
    if (Bits == 5) std::fill(qh, qh + 32, 0);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        if (Bits == 5) qh[l] = static_cast<uint8_t>(qh[l] | (lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
      }
  }
}

// ---- Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: x = d sc (q - 32) per 16 values. 128-value chunk c:
// value 128 c + 32 s + l (s = 0..3) has low nibble (ql[64 c + l + 32 (s % 2)] >> 4 (s / 2)) and top bits
// (qh[32 c + l] >> 2 s) & 3.
void deq_q6_k(const uint8_t* b, float* y, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 210, y += kQK) {
    const float d = f16(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int e = 0; e < kQK; ++e) {
      const int c = e / 128, s = (e % 128) / 32, l = e % 32;
      const int low = (b[64 * c + l + 32 * (s % 2)] >> (4 * (s / 2))) & 15;
      const int high = (b[128 + 32 * c + l] >> (2 * s)) & 3;
      y[e] = d * static_cast<float>(sc[e / 16]) * static_cast<float>((low | high << 4) - 32);
    }
  }
}
void q_q6_k(const float* x, uint8_t* b, int64_t n) {
  for (int64_t k = 0; k < n / kQK; ++k, b += 210, x += kQK) {
    int8_t L[kQK];
    float scales[16];
    const float max_scale = fit_sub_blocks(fit_symmetric, 32, x, L, scales);
    std::fill(b, b + 210, 0);
    if (std::fabs(max_scale) < 1e-15f) continue;  // all zero (d = 0)
    const float is = -128.0f / max_scale;
    put_f16(b + 208, 1 / is);
    int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(std::min(127, nearest_int(is * scales[j])));
    const float d = f16(b + 208);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * static_cast<float>(sc[j]);
      if (dl == 0) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * j + i] / dl))) + 32);
    }
    for (int e = 0; e < kQK; ++e) {
      const int c = e / 128, s = (e % 128) / 32, l = e % 32, q = L[e];
      uint8_t& low = b[64 * c + l + 32 * (s % 2)];
      low = static_cast<uint8_t>(low | (q & 15) << (4 * (s / 2)));
      b[128 + 32 * c + l] = static_cast<uint8_t>(b[128 + 32 * c + l] | (q >> 4) << (2 * s));
    }
  }
}

// ---- NF4 {float absmax; u8 codes[32]}: value 2 j in the high nibble of byte j.
constexpr std::array<float, 16> kNf4 = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};
// bitsandbytes' dQuantizeNF4 thresholds: the midpoints of neighbouring codes (in double, rounded to float32).
const std::array<float, 15>& nf4_midpoints() {
  static const std::array<float, 15> mid = [] {
    std::array<float, 15> m;
    for (int k = 0; k < 15; ++k)
      m[k] = static_cast<float>((static_cast<double>(kNf4[k]) + static_cast<double>(kNf4[k + 1])) / 2);
    return m;
  }();
  return mid;
}
uint8_t nf4_code(float v) {  // the number of midpoints v exceeds (0 for NaN)
  const auto& mid = nf4_midpoints();
  uint8_t c = 0;
  for (float m : mid) c = static_cast<uint8_t>(c + (v > m));
  return c;
}
void nf4_codes_of(const float* x, float absmax, uint8_t* codes) {  // 64 values
  const float inv = 1.0f / absmax;
  for (int j = 0; j < 32; ++j)
    codes[j] = static_cast<uint8_t>(nf4_code(x[2 * j] * inv) << 4 | nf4_code(x[2 * j + 1] * inv));
}
void nf4_values(const uint8_t* codes, float absmax, float* y) {  // 64 values
  for (int j = 0; j < 32; ++j) {
    y[2 * j] = kNf4[codes[j] >> 4] * absmax;
    y[2 * j + 1] = kNf4[codes[j] & 15] * absmax;
  }
}
void deq_nf4(const uint8_t* b, float* y, int64_t n) {
  for (int64_t k = 0; k < n / 64; ++k, b += 36, y += 64) {
    float absmax;
    std::memcpy(&absmax, b, 4);
    nf4_values(b + 4, absmax, y);
  }
}
float block_absmax(const float* x) {
  float a = 0;
  for (int j = 0; j < 64; ++j) a = std::fmax(a, std::fabs(x[j]));
  return a;
}
void q_nf4(const float* x, uint8_t* b, int64_t n) {
  for (int64_t k = 0; k < n / 64; ++k, b += 36, x += 64) {
    const float absmax = block_absmax(x);
    std::memcpy(b, &absmax, 4);
    nf4_codes_of(x, absmax, b + 4);
  }
}

constexpr BlockTypeInfo kTypes[] = {
    {BlockType::F32, "f32", 1, 4, deq_f32, q_f32},
    {BlockType::F16, "f16", 1, 2, deq_f16, q_f16},
    {BlockType::Q4_0, "q4_0", 32, 18, deq_legacy<4, false>, q_legacy<4, false>},
    {BlockType::Q4_1, "q4_1", 32, 20, deq_legacy<4, true>, q_legacy<4, true>},
    {BlockType::Q5_0, "q5_0", 32, 22, deq_legacy<5, false>, q_legacy<5, false>},
    {BlockType::Q5_1, "q5_1", 32, 24, deq_legacy<5, true>, q_legacy<5, true>},
    {BlockType::Q8_0, "q8_0", 32, 34, deq_q8_0, q_q8_0},
    {BlockType::Q2_K, "q2_k", kQK, 84, deq_q2_k, q_q2_k},
    {BlockType::Q3_K, "q3_k", kQK, 110, deq_q3_k, q_q3_k},
    {BlockType::Q4_K, "q4_k", kQK, 144, deq_qk<4>, q_qk<4>},
    {BlockType::Q5_K, "q5_k", kQK, 176, deq_qk<5>, q_qk<5>},
    {BlockType::Q6_K, "q6_k", kQK, 210, deq_q6_k, q_q6_k},
    {BlockType::BF16, "bf16", 1, 2, deq_bf16, q_bf16},
    {BlockType::NF4, "nf4", 64, 36, deq_nf4, q_nf4},
};

}  // namespace

std::span<const BlockTypeInfo> block_types() { return kTypes; }

const BlockTypeInfo& block_type(BlockType id) {
  for (const auto& t : kTypes)
    if (t.id == id) return t;
  CASTOR_ASSERT(false, "block type ", static_cast<int>(id), " is no row of the table");
  return kTypes[0];
}

const BlockTypeInfo* find_block_type(std::string_view name) {
  for (const auto& t : kTypes) {
    const std::string_view n = t.name;
    if (n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        }))
      return &t;
  }
  return nullptr;
}

int64_t row_bytes(BlockType id, int64_t n) {
  const BlockTypeInfo& t = block_type(id);
  CASTOR_CHECK(n % t.block == 0, t.name, ": a row of ", n, " values is not a whole number of blocks of ", t.block);
  return n / t.block * t.bytes;
}

const float* nf4_codes() { return kNf4.data(); }

// (The fuzz build of the GGUF header reader links the table above without the tensor runtime these use.)
#ifndef CASTOR_FUZZ_PARSERS_ONLY
DoubleQuantized double_quantize(const float* absmax, int64_t n) {
  DoubleQuantized q;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += absmax[i];
  q.offset = n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  std::vector<float> centred(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) centred[i] = absmax[i] - q.offset;
  q.codes.resize(static_cast<size_t>(n));
  q.scales.resize(static_cast<size_t>((n + 255) / 256));
  kernels::quantize_blockwise(centred.data(), n, 256, /*is_signed=*/true, q.codes.data(), q.scales.data());
  return q;
}

void double_dequantize(const DoubleQuantized& q, float* absmax) {
  const int64_t n = static_cast<int64_t>(q.codes.size());
  kernels::dequantize_blockwise(q.codes.data(), q.scales.data(), n, 256, /*is_signed=*/true, absmax);
  for (int64_t i = 0; i < n; ++i) absmax[i] += q.offset;
}

int64_t QuantizedMatrix::bytes() const {
  int64_t b = data.nbytes();
  if (absmax) b += static_cast<int64_t>(absmax->codes.size() + 4 * absmax->scales.size() + 4);
  return b;
}

QuantizedMatrix quantize_matrix(const float* x, int64_t rows, int64_t cols, BlockType type, bool double_quant) {
  const BlockTypeInfo& t = block_type(type);
  CASTOR_CHECK(!double_quant || type == BlockType::NF4, "double quantization is NF4's, not ", t.name, "'s");
  QuantizedMatrix q;
  q.type = type;
  q.rows = rows;
  q.cols = cols;
  const int64_t rb = row_bytes(type, cols);
  if (!double_quant) {
    q.data = empty({rows * rb}, DType::UInt8);
    uint8_t* d = q.data.data<uint8_t>();
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) t.quantize(x + r * cols, d + r * rb, cols);
    return q;
  }
  const int64_t blocks = rows * cols / 64;
  std::vector<float> absmax(static_cast<size_t>(blocks));
  q.data = empty({blocks * 32}, DType::UInt8);
  uint8_t* d = q.data.data<uint8_t>();
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t k = 0; k < blocks; ++k) {
    absmax[k] = block_absmax(x + 64 * k);
    nf4_codes_of(x + 64 * k, absmax[k], d + 32 * k);
  }
  q.absmax = std::make_unique<DoubleQuantized>(double_quantize(absmax.data(), blocks));
  return q;
}

void dequantize_rows(const QuantizedMatrix& q, int64_t r0, int64_t r1, float* out) {
  dequantize_tile(q, r0, r1, 0, q.cols, out);
}

namespace {

void check_tile(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t block = block_type(q.type).block;
  CASTOR_ASSERT(0 <= r0 && r0 <= r1 && r1 <= q.rows && 0 <= c0 && c0 <= c1 && c1 <= q.cols && c0 % block == 0 &&
                    c1 % block == 0,
                "dequantize_tile: rows [", r0, ", ", r1, ") columns [", c0, ", ", c1, ") of ", q.rows, " x ", q.cols);
}

// The tile [r0, r1) x [c0, c1) of blocks stored without double quantization, as runs of blocks: run(blocks, out,
// values) once for whole rows, else once a row; out (r1 - r0, c1 - c0) row-major.
template <class T, class Run>
void tile_runs(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, T* out, Run run) {
  check_tile(q, r0, r1, c0, c1);
  const int64_t block = block_type(q.type).block, n = c1 - c0;
  const int64_t rb = row_bytes(q.type, q.cols), skip = c0 / block * block_type(q.type).bytes;
  const uint8_t* d = q.data.data<uint8_t>();
  if (n == q.cols) return run(d + r0 * rb, out, (r1 - r0) * n);
  for (int64_t r = r0; r < r1; ++r) run(d + r * rb + skip, out + (r - r0) * n, n);
}

}  // namespace

void dequantize_tile(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out) {
  if (!q.absmax) return tile_runs(q, r0, r1, c0, c1, out, block_type(q.type).dequantize);
  check_tile(q, r0, r1, c0, c1);
  // NF4 with double quantization: each block's absmax as double_dequantize makes it, then its codes.
  const int64_t n = c1 - c0;
  const float* map = kernels::dynamic_map(true);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t first = (r * q.cols + c0) / 64;
    for (int64_t k = first; k < first + n / 64; ++k) {
      const float absmax = map[q.absmax->codes[k]] * q.absmax->scales[k / 256] + q.absmax->offset;
      nf4_values(q.data.data<uint8_t>() + 32 * k, absmax, out + (r - r0) * n + 64 * (k - first));
    }
  }
}

void dequantize_tile_bf16(const QuantizedMatrix& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, uint16_t* out) {
  if (const kernels::DequantizeBf16 fused = q.absmax ? nullptr : kernels::dequantize_bf16_kernel(q.type))
    return tile_runs(q, r0, r1, c0, c1, out, fused);
  // Whole blocks of about 4096 values at a time through float32, rounded by the bulk converter.
  const int64_t n = c1 - c0, block = block_type(q.type).block, chunk = std::max<int64_t>(1, 4096 / block) * block;
  std::vector<float> f(static_cast<size_t>(std::min(chunk, n)));
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; c += chunk) {
      const int64_t m = std::min(chunk, c1 - c);
      dequantize_tile(q, r, r + 1, c, c + m, f.data());
      convert_serial(f.data(), DType::Float32, out + (r - r0) * n + (c - c0), DType::BFloat16, static_cast<size_t>(m));
    }
}

#endif  // CASTOR_FUZZ_PARSERS_ONLY

}  // namespace castor::quant
