// Bulk dtype conversion (placeholder until the SIMD conversion layer lands).
#pragma once
#include <cstddef>
#include <cstdint>

#include "castor/dtype.h"

namespace castor {

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
const char* conversion_isa();

}  // namespace castor
