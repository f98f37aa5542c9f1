// Activation ops as typed definitions: GELU (exact and tanh) and SiLU, forward and backward together.
#pragma once
#include "autograd/op_def.h"

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
  static Tensor forward(const Tensor& input, bool tanh_approximate);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst = src * sigmoid(src).
template <>
struct OpDef<OpKind::Silu> {
  struct Params {};
  struct Saved {
    SavedTensor src;
  };
  static Tensor forward(const Tensor& input);
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
