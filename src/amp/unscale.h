// The fused unscale-and-check pass shared by GradScaler and the foreach entry point.
#pragma once
#include "castor/tensor.h"

namespace castor::amp {

// dst = src * inv_scale elementwise (the product taken in float32, or float64 for float64 tensors) in one
// pass that also tests every src element; returns true if any was inf or NaN. dst has src's shape and is
// either src itself (in place, any strides) or a contiguous float32 tensor.
bool unscale_into(const Tensor& src, const Tensor& dst, float inv_scale);

}  // namespace castor::amp
