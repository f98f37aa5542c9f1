// Portable, exact scalar conversions between float32 and IEEE binary16 (declared in castor/half.h).
#include "castor/half.h"

namespace castor {

namespace {
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

// binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. float32: 8 exponent bits (bias 127), 23
// mantissa bits. A normal half rebiases its exponent by 127 - 15 = 112; a subnormal half (m * 2^-24) is
// normalised by shifting its mantissa up to the implicit bit.
float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) {  // inf, or NaN: payload kept in the top mantissa bits, quiet bit set
    return bits_float(sign | 0x7f800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    int e = 1;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --e;
    }
    return bits_float(sign | (static_cast<uint32_t>(e + 112) << 23) | ((man & 0x3ffu) << 13));
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half_bits(float f) {
  uint32_t u = float_bits(f);
  auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN: quiet
  // 65520 = 0x477ff000 is the midpoint between the largest half (65504, odd mantissa) and 2^16: it and
  // everything above round to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // >= 2^-14: normal half. Rebias, then round away the low 13 mantissa bits.
    uint32_t r = a - (112u << 23);
    r += 0x0fffu + ((r >> 13) & 1u);  // a carry out of the mantissa correctly bumps the exponent
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal half: the result counts units of 2^-24. 2^-25 (0x33000000) is the tie between 0 and one unit.
  if (a <= 0x33000000u) return sign;
  uint32_t exp = a >> 23;                      // 102..112 here
  uint32_t man = (a & 0x7fffffu) | 0x800000u;  // value = man * 2^(exp - 150) = man * 2^(exp - 126) units
  uint32_t shift = 126 - exp;                  // 14..24
  uint32_t q = man >> shift;
  uint32_t rem = man & ((1u << shift) - 1u);
  uint32_t half_unit = 1u << (shift - 1);
  if (rem > half_unit || (rem == half_unit && (q & 1u))) ++q;  // q == 0x400 becomes the smallest normal
  return static_cast<uint16_t>(sign | q);
}

}  // namespace castor
