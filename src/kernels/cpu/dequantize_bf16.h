// Internal: block types dequantized straight into bfloat16 (each value float_to_bf16_bits of what the type's
// dequantize computes, widened and scaled in registers, no float32 pass through memory), one row per type and
// instruction set, the widest the CPU runs picked at run time; exposed so tests can run each row.
#pragma once
#include <cstdint>
#include <span>

#include "castor/quant.h"

namespace castor::kernels {

using DequantizeBf16 = void (*)(const uint8_t* blocks, uint16_t* y, int64_t n);  // n: whole blocks' values

struct DequantizeBf16Kernel {
  quant::BlockType type;
  const char* isa;  // a bulk conversion set's name (conversion_isa()): the row runs where that set is enabled
  DequantizeBf16 run;
};

// Each type's rows, widest set first, its scalar reference ("portable") last.
std::span<const DequantizeBf16Kernel> dequantize_bf16_kernels();
// The widest enabled row of `type`, or null for a type without rows (its values go through float32 then).
DequantizeBf16 dequantize_bf16_kernel(quant::BlockType type);

}  // namespace castor::kernels
