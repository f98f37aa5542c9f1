// Internal: the vectorised GELU (tanh form) maps behind kernels::unary / kernels::binary (AVX-512, else AVX2) and
// the SwiGLU maps behind kernels::swiglu_forward / swiglu_backward (AVX2, 16-bit tensors only); each
// returns false (doing nothing) where it does not apply: operands not all contiguous of one float32/16-bit dtype and
// size.
#pragma once
#include "castor/tensor.h"

namespace castor::kernels {

bool gelu_tanh_fast(const Tensor& src, const Tensor& dst);                                    // dst = gelu_tanh(src)
bool gelu_tanh_grad_fast(const Tensor& diff_dst, const Tensor& src, const Tensor& diff_src);  // g * gelu_tanh'(x)
bool swiglu_fast(const Tensor& a, const Tensor& b, const Tensor& dst);                        // dst = silu(a) * b
// diff_a = g b silu'(a), diff_b = g silu(a); either may be undefined.
bool swiglu_grad_fast(const Tensor& a, const Tensor& b, const Tensor& diff_dst, const Tensor& diff_a,
                      const Tensor& diff_b);

}  // namespace castor::kernels
