// Apex's opt levels O0-O3 as a value: what amp::initialize takes and `castor train --amp` names.
#pragma once
#include <string>

#include "castor/dtype.h"

namespace castor::amp {

enum class OptLevel { O0, O1, O2, O3 };
OptLevel parse_opt_level(const std::string& s);  // "O0".."O3"; raises naming the text otherwise
const char* opt_level_name(OptLevel level);

// What `--precision auto` picks on this CPU: O1 bfloat16 where it has bfloat16 dot-product units
// (backends::bf16_dot_units(), honouring ONEDNN_MAX_CPU_ISA), else O0 float32, which emulated bfloat16 does not beat.
struct AutoPrecision {
  OptLevel level;
  DType dtype;         // the 16-bit type of O1 (bfloat16 either way)
  std::string reason;  // "auto: avx512_bf16" or "auto: no bf16 units on this CPU; --precision bf16-mixed to force it"
};
AutoPrecision auto_precision();

}  // namespace castor::amp
