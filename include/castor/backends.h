// Kernel choices that trade a documented amount of float32 precision for speed, as PyTorch's torch.backends flags.
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

}  // namespace castor::backends
