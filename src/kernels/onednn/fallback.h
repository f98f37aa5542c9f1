// Helpers shared by the oneDNN layer kernels: wrapping tensors as oneDNN memory, and the exact float32 copies that
// 16-bit tensors run on where oneDNN has no kernel for their dtype.
#pragma once
#include <dnnl.hpp>

#include "kernels/kernels.h"
#include "kernels/onednn/onednn.h"

namespace castor::kernels {

// A oneDNN view of a tensor's buffer, laid out as `desc` says.
inline dnnl::memory as_memory(const dnnl::memory::desc& desc, const Tensor& t) {
  return dnnl::memory(desc, engine(), t.data_ptr());
}

// Whether activation `t` is strictly channels-last (see Tensor::suggest_memory_format).
inline bool channels_last(const Tensor& t) { return t.suggest_memory_format() == MemoryFormat::ChannelsLast; }

// Asserts that activation `t` is laid out like `src` (the batch norm and pooling contract in kernels/layers.h).
inline void assert_laid_out_like(const Tensor& t, const Tensor& src) {
  CASTOR_ASSERT(!t.defined() || t.is_contiguous(src.suggest_memory_format()), t.describe(), " is not laid out like ",
                src.describe());
}

// A float32 tensor laid out like `t`, to compute what `t` will hold (undefined stays undefined).
inline Tensor float_like(const Tensor& t) { return t.defined() ? empty_like(t, DType::Float32) : t; }

// The exact float32 copy of a tensor, laid out alike (an undefined tensor stays undefined).
inline Tensor widen(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor f = float_like(t);
  copy(t, f);
  return f;
}

// Rounds a float32 result once into its destination (nothing for an undefined destination).
inline void round_into(const Tensor& f, const Tensor& dst) {
  if (dst.defined()) copy(f, dst);
}

}  // namespace castor::kernels
