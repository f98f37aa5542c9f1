// Placeholder binary16 conversions (replaced by the conversion layer).
#include "castor/half.h"
#include <cmath>
namespace castor {
float half_bits_to_float(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023; float s = (h & 0x8000) ? -1.f : 1.f;
  if (e == 31) return m ? NAN : s * INFINITY;
  if (e == 0) return s * std::ldexp((float)m, -24);
  return s * std::ldexp((float)(m | 1024), e - 25);
}
uint16_t float_to_half_bits(float f) {
  uint32_t u; std::memcpy(&u, &f, 4); uint16_t sign = (u >> 16) & 0x8000; u &= 0x7fffffff;
  if (u > 0x7f800000) return sign | 0x7e00;
  if (u >= 0x477ff000) return sign | 0x7c00;
  if (u < 0x38800000) { float a; std::memcpy(&a, &u, 4); return sign | (uint16_t)std::nearbyint(a * 16777216.f); }
  uint32_t r = u + 0xfff + ((u >> 13) & 1); return sign | (uint16_t)((r >> 13) - (112 << 10));
}
}  // namespace castor
