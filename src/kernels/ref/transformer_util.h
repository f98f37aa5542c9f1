// Internal: what the reference and fast transformer kernels share: the attention mask, the target check.
#pragma once
#include <cstdint>
#include <algorithm>
#include <limits>

#include "castor/tensor.h"

namespace castor::kernels {

struct AttentionMask {
  bool causal = false;
  Tensor values;           // undefined, bool, or the additive mask in the scores' compute type
  int64_t stride[4] = {};  // element strides over (B, H, Tq, Tk), 0 on broadcast dims

  // Masks scores s[0, j1 - j0) of query row i against keys [j0, j1): -inf where dropped, + the additive mask.
  template <class T>
  void apply(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t j1, T* s) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    if (causal)
      for (int64_t j = std::max(j0, i + 1); j < j1; ++j) s[j - j0] = kNegInf;
    if (!values.defined()) return;
    const int64_t row = b * stride[0] + h * stride[1] + i * stride[2], sj = stride[3];
    if (values.dtype() == DType::Bool) {
      const bool* m = static_cast<const bool*>(values.data_ptr()) + row;
      for (int64_t j = j0; j < j1; ++j)
        if (!m[j * sj]) s[j - j0] = kNegInf;
    } else {
      const T* m = static_cast<const T*>(values.data_ptr()) + row;
      for (int64_t j = j0; j < j1; ++j) s[j - j0] += m[j * sj];
    }
  }
};

// The mask of an attention call; a floating mask is converted once to `scores` (float32 or float64), keeping its
// (broadcastable) shape. A mask that does not broadcast to (B, H, Tq, Tk) is a castor::Error.
AttentionMask attention_mask(const Tensor& mask, bool is_causal, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                             DType scores);

// Throws castor::Error for a target outside [0, V) other than ignore_index.
void check_targets(const Tensor& target, int64_t V, int64_t ignore_index);

}  // namespace castor::kernels
