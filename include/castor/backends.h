// Kernel choices that trade a documented amount of float32 precision for speed, as PyTorch's torch.backends flags,
// and what the CPU offers 16-bit training.
#pragma once

namespace castor::backends {

// How float32 convolutions run. Auto (the default): 3x3, stride-1, undilated, ungrouped float32 convolutions with at
// least 64 input channels run as Winograd F(4x4, 3x3) where oneDNN has it (CPUs with AVX-512): 2-2.5x faster in all three passes, with errors a few
// times float32's direct ones (docs/numerics.md); the rest run direct. Direct: every convolution runs direct (the
// numerics of PyTorch's CPU convolutions). PyTorch's counterpart is torch.backends.cudnn.allow_tf32, on by default,
// which lets cuDNN trade float32 precision for speed in the same place. 16-bit convolutions always run direct.
enum class ConvAlgorithm { Auto, Direct };

void set_conv_algorithm(ConvAlgorithm algorithm);
ConvAlgorithm conv_algorithm();

// The CPU's bfloat16 dot-product units that oneDNN's kernels use, as ONEDNN_MAX_CPU_ISA caps them: "amx_bf16" (AMX
// tiles; such CPUs have AVX512_BF16 too), "avx512_bf16", or nullptr where there are none (AVX2-only CPUs, AVX-512
// without BF16, or a cap below AVX512_CORE_BF16). Without them bfloat16 GEMMs and convolutions are emulated (float32
// arithmetic on widened 16-bit inputs), and O1 bfloat16 trains no faster than float32 (docs/numerics.md).
const char* bf16_dot_units();

}  // namespace castor::backends
