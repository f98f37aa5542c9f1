// Type promotion, dtype parsing, and the error tiers' abort path.
#include <cstdio>
#include <cstdlib>

#include "castor/check.h"
#include "castor/dtype.h"
#include "castor/op_kind.h"

namespace castor {

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const int ca = traits(a).category, cb = traits(b).category;
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
    return DType::Float32;  // float32 with a 16-bit type, and float16 with bfloat16
  }
  // Integers: the wider type wins (uint8 with a signed type gives the signed type).
  return dtype_size(a) >= dtype_size(b) ? (a == DType::UInt8 ? b : a) : b;
}

DType parse_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32" || s == "f32" || s == "float") return DType::Float32;
  if (s == "float16" || s == "fp16" || s == "f16" || s == "half") return DType::Float16;
  if (s == "bfloat16" || s == "bf16") return DType::BFloat16;
  if (s == "float64" || s == "fp64" || s == "f64" || s == "double") return DType::Float64;
  for (const DTypeTraits& t : kDTypeTraits)
    if (s == t.name) return static_cast<DType>(&t - kDTypeTraits);
  throw Error(detail::cat("unknown dtype '", s,
                          "' (expected one of float32, float16, bfloat16, float64, int64, int32, "
                          "uint8, bool, or fp32/fp16/bf16)"));
}

const char* policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::LowerPrecision: return "lower_precision";
    case CastPolicy::Float32: return "fp32";
    case CastPolicy::Promote: return "promote";
    case CastPolicy::PassThrough: return "pass_through";
    case CastPolicy::Banned: return "banned";
    case CastPolicy::Float32InKernel: return "fp32_in_kernel";
  }
  return "?";
}

namespace detail {
void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "castor: internal error: %s:%d: %s failed: %s\n", file, line, cond, msg.c_str());
  std::abort();
}
}  // namespace detail

}  // namespace castor
