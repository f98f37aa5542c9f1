// Block types dequantized straight into bfloat16 (kernels/cpu/dequantize_bf16.h): the codes widened and scaled in
// registers and rounded once as float_to_bf16_bits rounds, for the frozen quantized products' bfloat16 tiles.
// Q8_0 {half d; i8 qs[32]}: each value q * d in float32 is exact (an 8-bit integer times an 11-bit mantissa, never
// below float32's normal range), so any correct rounding of it is the reference's.
#include "kernels/cpu/dequantize_bf16.h"

#include <immintrin.h>

#include <cstring>

#include "castor/half.h"
#include "core/convert_kernels.h"
#include "kernels/cpu/avx512.h"

namespace castor::kernels {

namespace {

uint16_t half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// ---- scalar reference: the dequantize-then-round path value by value
void q8_0_portable(const uint8_t* b, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n / 32; ++k, b += 34, y += 32) {
    const float d = half_bits_to_float(half_at(b));
    for (int j = 0; j < 32; ++j) y[j] = float_to_bf16_bits(static_cast<float>(static_cast<int8_t>(b[2 + j])) * d);
  }
}

// ---- AVX2 + F16C: 8 lanes, bfloat16 by integer rounding (F16C widens the scale as half_bits_to_float does, NaN
// payloads included)
__attribute__((target("avx2,f16c"))) void q8_0_avx2(const uint8_t* b, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n / 32; ++k, b += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(half_at(b)));
    for (int j = 0; j < 32; j += 16) {
      auto lanes = [&](int at) {  // values at..at+7 as float32 bits
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + at));
        return _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
      };
      const __m256i lo = detail::f32_to_bf16_lanes_avx2(lanes(j)), hi = detail::f32_to_bf16_lanes_avx2(lanes(j + 8));
      // packus works per 128-bit half: [lo0-3 hi0-3 lo4-7 hi4-7]; the permute restores element order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
    }
  }
}

// ---- AVX-512: 16 lanes; rounded by vcvtne2ps2bf16 where the CPU has AVX512_BF16 (round to nearest even, NaN quieted
// as float_to_bf16_bits; its flushing of subnormal inputs never meets a q8_0 value), else by integer rounding.
CASTOR_AVX512_BEGIN
__attribute__((target("avx512f,f16c"), always_inline)) inline void q8_0_block_avx512(const uint8_t* b, __m512& lo,
                                                                                     __m512& hi) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(half_at(b)));
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
  hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
}
__attribute__((target("avx512f,f16c"))) void q8_0_avx512(const uint8_t* b, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n / 32; ++k, b += 34, y += 32) {
    __m512 lo, hi;
    q8_0_block_avx512(b, lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), detail::f32_to_bf16_lanes_avx512(_mm512_castps_si512(lo)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 16), detail::f32_to_bf16_lanes_avx512(_mm512_castps_si512(hi)));
  }
}
__attribute__((target("avx512f,avx512bf16,f16c"))) void q8_0_avx512bf16(const uint8_t* b, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n / 32; ++k, b += 34, y += 32) {
    __m512 lo, hi;
    q8_0_block_avx512(b, lo, hi);
    _mm512_storeu_si512(y, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}
CASTOR_AVX512_END

constexpr DequantizeBf16Kernel kKernels[] = {
    {quant::BlockType::Q8_0, "avx512bf16", q8_0_avx512bf16},
    {quant::BlockType::Q8_0, "avx512f", q8_0_avx512},
    {quant::BlockType::Q8_0, "avx2+f16c", q8_0_avx2},
    {quant::BlockType::Q8_0, "portable", q8_0_portable},
};

}  // namespace

std::span<const DequantizeBf16Kernel> dequantize_bf16_kernels() { return kKernels; }

DequantizeBf16 dequantize_bf16_kernel(quant::BlockType type) {
  for (const auto& k : kKernels)
    if (k.type == type && detail::isa_enabled(k.isa)) return k.run;
  return nullptr;
}

}  // namespace castor::kernels
