// Internal: the per-instruction-set bulk float32 <-> float16/bfloat16 kernels, exposed so tests can run each one.
#pragma once
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

}  // namespace castor::detail
