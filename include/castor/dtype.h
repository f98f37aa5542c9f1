// Scalar types: one X-macro table of every dtype and its traits, and PyTorch's type-promotion rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "castor/half.h"

namespace castor {

// _(Enum, C++ type, name, safetensors name, category) where category orders promotion: 0 bool, 1 int, 2 float.
#define CASTOR_FORALL_DTYPES(_)                \
  _(Float32, float, "float32", "F32", 2)       \
  _(Float16, Half, "float16", "F16", 2)        \
  _(BFloat16, BFloat16, "bfloat16", "BF16", 2) \
  _(Float64, double, "float64", "F64", 2)      \
  _(Int64, int64_t, "int64", "I64", 1)         \
  _(Int32, int32_t, "int32", "I32", 1)         \
  _(UInt8, uint8_t, "uint8", "U8", 1)          \
  _(Bool, bool, "bool", "BOOL", 0)

enum class DType : uint8_t {
#define CASTOR_DTYPE_ENUM(e, t, n, s, c) e,
  CASTOR_FORALL_DTYPES(CASTOR_DTYPE_ENUM)
#undef CASTOR_DTYPE_ENUM
};

#define CASTOR_DTYPE_COUNT(e, t, n, s, c) +1
inline constexpr int kNumDTypes = 0 CASTOR_FORALL_DTYPES(CASTOR_DTYPE_COUNT);
#undef CASTOR_DTYPE_COUNT

struct DTypeTraits {
  const char* name;              // PyTorch's name: "float32", "bfloat16", ...
  const char* safetensors_name;  // "F32", "BF16", ...
  size_t size;                   // bytes per element
  int category;                  // 0 bool, 1 integer, 2 floating point
};

inline constexpr DTypeTraits kDTypeTraits[] = {
#define CASTOR_DTYPE_TRAITS(e, t, n, s, c) {n, s, sizeof(t), c},
    CASTOR_FORALL_DTYPES(CASTOR_DTYPE_TRAITS)
#undef CASTOR_DTYPE_TRAITS
};
static_assert(sizeof(kDTypeTraits) / sizeof(kDTypeTraits[0]) == kNumDTypes, "a dtype lacks traits");
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit types must be 2 bytes");

inline const DTypeTraits& traits(DType d) { return kDTypeTraits[static_cast<int>(d)]; }
inline const char* dtype_name(DType d) { return traits(d).name; }
inline size_t dtype_size(DType d) { return traits(d).size; }
inline bool is_floating(DType d) { return traits(d).category == 2; }
inline bool is_16bit_float(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

// Maps a C++ type to its DType at compile time: dtype_of<float>() == DType::Float32.
template <class T>
constexpr DType dtype_of();
#define CASTOR_DTYPE_OF(e, t, n, s, c) \
  template <>                          \
  constexpr DType dtype_of<t>() {      \
    return DType::e;                   \
  }
CASTOR_FORALL_DTYPES(CASTOR_DTYPE_OF)
#undef CASTOR_DTYPE_OF

// PyTorch's promoteTypes for two dtypes: float16 with bfloat16 gives float32; floats beat integers;
// among integers the wider wins (uint8 with a signed type gives the signed type, at least int16 -> int32 here).
DType promote_types(DType a, DType b);

// Parses "float32"/"fp32"/"f32"/"bf16"/... into a DType; throws a CHECK error naming the text otherwise.
DType parse_dtype(const std::string& s);

}  // namespace castor
