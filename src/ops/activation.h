// Activation ops as typed definitions: GELU (exact and tanh) and SiLU. Their forwards are castor::gelu and
// castor::silu (castor/ops.h), defined beside these backwards in activation.cpp.
#pragma once
#include "ops/op_def.h"

namespace castor {

// dst = gelu(src) (exact erf form, or the tanh approximation); integer inputs compute in float32.
template <>
struct OpDef<OpKind::Gelu> {
  struct Params {
    bool tanh_approximate;
  };
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src * sigmoid(src).
template <>
struct OpDef<OpKind::Silu> {
  struct Params {};
  struct Saved {
    SavedTensor src;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
