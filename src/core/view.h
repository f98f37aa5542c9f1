// An alias of a tensor's storage with new sizes, strides and offset, shared by the core and the recorded views.
#pragma once
#include "castor/tensor.h"

namespace castor {

// A tensor over base's storage (same dtype), not recorded for autograd and without gradient metadata.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

}  // namespace castor
