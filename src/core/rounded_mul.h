// A product rounded on its own, immune to the compiler's fused multiply-add contraction.
#pragma once
#include <cmath>

namespace castor {

// PyTorch (separate tensor ops, or Python floats) rounds a * b before adding to it, while the compiler may
// contract a plain a * b + c into one fused multiply-add (GCC does by default). fma(a, b, -0) is exactly
// round(a * b), signed zeros included, and is never contracted further.
inline float rounded_mul(float a, float b) { return std::fma(a, b, -0.0f); }
inline double rounded_mul(double a, double b) { return std::fma(a, b, -0.0); }

}  // namespace castor
