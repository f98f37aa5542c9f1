// The Function op as a typed definition: a user-defined autograd::Function (castor/autograd.h), whose forward is
// autograd::apply_function and whose backward calls the user's.
#pragma once
#include <string>

#include "ops/op_def.h"

namespace castor {

template <>
struct OpDef<OpKind::Function> {
  struct Params {
    std::shared_ptr<autograd::FunctionCtx> ctx;  // what forward handed backward, and its autocast state
    autograd::BackwardFn fn;
    std::string name;  // for errors: autograd::Function "<its autocast name>"
  };
  struct Saved {
    std::vector<SavedTensor> tensors;  // ctx.save_for_backward's, in order
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

}  // namespace castor
