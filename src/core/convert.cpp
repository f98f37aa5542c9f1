// Bulk dtype conversion (placeholder: portable loops).
#include "castor/convert.h"

#include <cmath>
#include <cstring>

namespace castor {

void convert_f32_to_f16(const float* s, uint16_t* d, size_t n) { for (size_t i = 0; i < n; ++i) d[i] = float_to_half_bits(s[i]); }
void convert_f16_to_f32(const uint16_t* s, float* d, size_t n) { for (size_t i = 0; i < n; ++i) d[i] = half_bits_to_float(s[i]); }
void convert_f32_to_bf16(const float* s, uint16_t* d, size_t n) { for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(s[i]); }
void convert_bf16_to_f32(const uint16_t* s, float* d, size_t n) { for (size_t i = 0; i < n; ++i) d[i] = bf16_bits_to_float(s[i]); }
const char* conversion_isa() { return "portable"; }

template <class S, class D>
static void cast_loop(const S* s, D* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, bool>) d[i] = static_cast<double>(s[i]) != 0.0 || std::isnan(static_cast<double>(s[i]));
    else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) d[i] = D(static_cast<float>(s[i]));
    else d[i] = static_cast<D>(static_cast<std::conditional_t<std::is_integral_v<D>, double, D>>(static_cast<double>(s[i])));
  }
}

template <class S>
static void convert_from(const S* s, void* d, DType dd, size_t n) {
  switch (dd) {
#define CASE(e, t, nm, st, c) case DType::e: cast_loop(s, static_cast<t*>(d), n); break;
    CASTOR_FORALL_DTYPES(CASE)
#undef CASE
  }
}

void convert(const void* s, DType sd, void* d, DType dd, size_t n) {
  if (sd == dd) { std::memcpy(d, s, n * dtype_size(sd)); return; }
  switch (sd) {
#define CASE(e, t, nm, st, c) case DType::e: convert_from(static_cast<const t*>(s), d, dd, n); break;
    CASTOR_FORALL_DTYPES(CASE)
#undef CASE
  }
}

}  // namespace castor
