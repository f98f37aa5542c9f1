// Internal: the vectorised GELU (tanh form) maps behind kernels::unary / kernels::binary (AVX-512, else AVX2); each
// returns false (doing nothing) where it does not apply: operands not all contiguous of one float32/16-bit dtype and
// size.
#pragma once
#include "castor/tensor.h"

namespace castor::kernels {

bool gelu_tanh_fast(const Tensor& src, const Tensor& dst);                             // dst = gelu_tanh(src)
bool gelu_tanh_grad_fast(const Tensor& diff_dst, const Tensor& src, const Tensor& diff_src);  // g * gelu_tanh'(x)

}  // namespace castor::kernels
