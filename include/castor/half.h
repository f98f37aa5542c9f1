// 16-bit floats as raw bits (c10 style): IEEE binary16 and bfloat16, with exact scalar conversions.
#pragma once
#include <cstdint>
#include <cstring>

namespace castor {

// Scalar conversions, portable and exact: round to nearest even, subnormals kept, overflow to +-inf,
// NaN stays NaN (quiet, sign kept).
float half_bits_to_float(uint16_t h);
uint16_t float_to_half_bits(float f);
inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

struct alignas(2) Half {
  uint16_t x = 0;
  struct from_bits_t {};
  Half() = default;
  constexpr Half(uint16_t bits, from_bits_t) : x(bits) {}
  Half(float f) : x(float_to_half_bits(f)) {}  // NOLINT: implicit like c10::Half
  operator float() const { return half_bits_to_float(x); }
};

struct alignas(2) BFloat16 {
  uint16_t x = 0;
  struct from_bits_t {};
  BFloat16() = default;
  constexpr BFloat16(uint16_t bits, from_bits_t) : x(bits) {}
  BFloat16(float f) : x(float_to_bf16_bits(f)) {}  // NOLINT: implicit like c10::BFloat16
  operator float() const { return bf16_bits_to_float(x); }
};

}  // namespace castor
