// Helpers shared by the oneDNN layer kernels: wrapping tensors as oneDNN memory, and the exact float32 copies that
// 16-bit tensors run on where oneDNN has no kernel for their dtype.
#pragma once
#include <dnnl.hpp>

#include "kernels/kernels.h"
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

// A oneDNN view of a contiguous tensor's buffer.
inline dnnl::memory as_memory(const dnnl::memory::desc& desc, const Tensor& t) {
  return dnnl::memory(desc, engine(), t.data_ptr());
}

// The exact float32 copy of a tensor (an undefined tensor stays undefined).
inline Tensor widen(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor f = empty(t.shape(), DType::Float32);
  copy(t, f);
  return f;
}

// A float32 tensor to compute what `t` will hold (undefined stays undefined).
inline Tensor float_like(const Tensor& t) { return t.defined() ? empty(t.shape(), DType::Float32) : t; }

// Rounds a float32 result once into its destination (nothing for an undefined destination).
inline void round_into(const Tensor& f, const Tensor& dst) {
  if (dst.defined()) copy(f, dst);
}

}  // namespace castor::kernels
