// Rounding float32 values into a 16-bit tensor: to nearest even, or stochastically (optimizer write-back).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "castor/convert.h"
#include "castor/random.h"
#include "core/parallel.h"
#include "kernels/kernels.h"

namespace castor::kernels {

namespace {

// Stochastic rounding to bfloat16: add 16 uniform random bits below the 16 kept ones, then truncate.
// inf and NaN round as usual; a finite value above the largest bfloat16 saturates instead of becoming inf.
uint16_t stochastic_bf16(float x, uint32_t random16) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return float_to_bf16_bits(x);
  const uint32_t r = (u + random16) >> 16;
  if ((r & 0x7f80u) == 0x7f80u) return static_cast<uint16_t>((r & 0x8000u) | 0x7f7fu);
  return static_cast<uint16_t>(r);
}

// Stochastic rounding to float16: scale |x| by its float16 ulp (exact, a power of two), keep the integer
// part and add one with probability equal to the fraction. Values between 65504 and 2^16 saturate to
// 65504; beyond, and for inf/NaN, the usual rounding applies (inf).
uint16_t stochastic_f16(float x, uint32_t random24) {
  const float a = std::fabs(x);
  if (!(a < 65536.0f)) return float_to_half_bits(x);
  uint32_t u;
  std::memcpy(&u, &a, 4);
  const int binade = std::max(static_cast<int>(u >> 23) - 127, -14);  // float16 subnormals share 2^-24
  const uint32_t ulp_bits = static_cast<uint32_t>(binade - 10 + 127) << 23;
  float ulp;
  std::memcpy(&ulp, &ulp_bits, 4);
  const float q = a / ulp;
  float kept = std::floor(q);
  if (static_cast<float>(random24) * 0x1.0p-24f < q - kept) kept += 1.0f;
  return float_to_half_bits(std::copysign(std::min(kept * ulp, 65504.0f), x));
}

}  // namespace

void round_block_into_16bit(const float* src, const RoundInto& into, int64_t begin, int64_t end) {
  if (!into.dst) return;
  const DType d = into.dst->dtype();
  uint16_t* out = static_cast<uint16_t*>(into.dst->data_ptr());
  if (!into.stochastic) {  // streamed: the next forward reads it only after the whole step
    convert_streaming(src + begin, DType::Float32, out + begin, d, end - begin);
    return;
  }
  Generator bits(into.key + static_cast<uint64_t>(begin / kBlock));
  if (d == DType::BFloat16)
    for (int64_t i = begin; i < end; ++i)
      out[i] = stochastic_bf16(src[i], static_cast<uint32_t>(bits.next_u64() >> 48));
  else
    for (int64_t i = begin; i < end; ++i) out[i] = stochastic_f16(src[i], static_cast<uint32_t>(bits.next_u64() >> 40));
}

void round_into_16bit(const float* src, const RoundInto& into) {
  if (!into.dst) return;
  CASTOR_ASSERT(is_16bit_float(into.dst->dtype()) && into.dst->is_contiguous(), "round_into_16bit: bad destination ",
                into.dst->describe());
  parallel_blocks(into.dst->numel(), [&](int64_t b, int64_t e) { round_block_into_16bit(src, into, b, e); });
}

}  // namespace castor::kernels
