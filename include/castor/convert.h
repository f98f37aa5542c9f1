// Bulk dtype conversion: fast float32 <-> float16/bfloat16 kernels chosen at run time, and any-to-any convert().
#pragma once
#include <cstddef>
#include <cstdint>

#include "castor/dtype.h"

namespace castor {

// Bulk versions of float_to_half_bits/half_bits_to_float/float_to_bf16_bits/bf16_bits_to_float (half.h):
// bit-identical to them on every input, NaN payloads included, whichever instruction set is active.
// src and dst must not overlap. Arrays above ~64K elements are split across OpenMP threads.
void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);

// Converts n elements between any two dtypes, with PyTorch's semantics on x86:
//  - floating -> integer truncates toward zero; NaN and values outside the range of int32 (for Int32) or
//    int64 (for Int64 and UInt8) give that type's minimum; UInt8 then keeps the low 8 bits (300.7 -> 44,
//    -1.5 -> 255).
//  - integer -> narrower integer keeps the low bits; anything -> Bool is != 0 (NaN -> true).
//  - a float16/bfloat16 on either side (other than with float32) goes through float32, as c10::Half does, so
//    float64 and int64 sources round twice (float64 1 + 2^-11 + 2^-40 -> float16 1.0, like torch).
// src and dst must not overlap unless src_dtype == dst_dtype (then it is a memmove).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
// convert() on the calling thread whatever n, for kernels already running their own parallel loops.
void convert_serial(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

// convert() with the same results, writing float32 <-> bfloat16 with non-temporal stores where the active kernels
// have them: for a destination read again only after much else has gone through the cache (gradients delivered to
// leaves, optimizers' 16-bit write-backs), where it saves reading the destination's lines before writing them.
void convert_streaming(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

// The instruction set of the active bulk kernels: "avx512bf16", "avx512f", "avx2+f16c" or "portable".
const char* conversion_isa();
// Whether those kernels are AVX-512 ones (the CPU has it and ONEDNN_MAX_CPU_ISA allows it): the test every kernel with
// AVX-512 twins chosen at run time makes.
bool avx512_kernels();
// Whether the CPU also has AVX512_BW and AVX512_VBMI (byte permutes) for the AVX-512 kernels that use them.
bool avx512_vbmi_kernels();

}  // namespace castor
