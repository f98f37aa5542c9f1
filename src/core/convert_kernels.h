// Internal: the per-instruction-set bulk float32 <-> float16/bfloat16 kernels, exposed so tests can run each one, and
// the bfloat16 rounding on vector lanes they share with other kernels that write bfloat16.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace castor::detail {

struct ConvertKernels {
  const char* isa;      // what conversion_isa() reports when this set is active
  bool (*supported)();  // whether this CPU (and OS) can run it
  void (*f32_to_f16)(const float* src, uint16_t* dst, size_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, size_t n);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, size_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, size_t n);
  // The same results written with non-temporal stores where the set has them (convert_streaming).
  void (*f32_to_bf16_stream)(const float* src, uint16_t* dst, size_t n);
  void (*bf16_to_f32_stream)(const uint16_t* src, float* dst, size_t n);
};

// Every kernel set, best first; the last one is the portable scalar set and is always supported.
extern const ConvertKernels kConvertKernels[];
extern const size_t kNumConvertKernels;

// Whether `isa` (one of the sets' names) is the active set (conversion_isa(): the CPU's widest under
// ONEDNN_MAX_CPU_ISA) or a narrower one: what a kernel with a twin per set may run.
bool isa_enabled(const char* isa);

// float_to_bf16_bits on 8 lanes, results in the low 16 bits of each 32-bit lane.
__attribute__((target("avx2"))) inline __m256i f32_to_bf16_lanes_avx2(__m256i u) {
  const __m256i one = _mm256_set1_epi32(1);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // both sides non-negative
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

// float_to_bf16_bits on 16 lanes, narrowed to 16 bits.
__attribute__((target("avx512f"))) inline __m256i f32_to_bf16_lanes_avx512(__m512i u) {
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __mmask16 is_nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, is_nan, quiet_nan));
}

}  // namespace castor::detail
