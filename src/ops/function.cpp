// User-defined autograd Functions: forward without history (custom_fwd), recorded as a Function node whose backward
// calls the user's under the autocast state forward ran under (custom_bwd).
#include "ops/function.h"

#include "castor/autograd.h"

namespace castor {
namespace autograd {

struct FunctionAccess {
  static std::vector<Tensor>& to_save(FunctionCtx& c) { return c.to_save_; }
  static std::vector<Tensor>& saved(FunctionCtx& c) { return c.saved_; }
  static std::vector<bool>& needs_input_grad(FunctionCtx& c) { return c.needs_input_grad_; }
  static amp::AutocastState& forward_autocast(FunctionCtx& c) { return c.forward_autocast_; }
};

using A = FunctionAccess;

Tensor apply_function(const ForwardFn& forward, BackwardFn backward, const std::vector<Tensor>& inputs,
                      const amp::CustomOp* cast, const std::string& given_name) {
  const std::string name = !given_name.empty() ? given_name
                           : cast              ? "autograd::Function \"" + cast->name() + "\""
                                               : std::string("autograd::Function");
  auto ctx = std::make_shared<FunctionCtx>();
  std::vector<Tensor> used;  // the inputs as forward got them (after autocast)
  auto run = [&](const std::vector<Tensor>& in) {
    used = in;
    for (const Tensor& t : in) A::needs_input_grad(*ctx).push_back(t.defined() && t.requires_grad());
    A::forward_autocast(*ctx) = amp::autocast_state();
    NoGradGuard no_grad;
    return forward(*ctx, in);
  };
  Tensor out = cast ? (*cast)(inputs, run) : run(inputs);
  CASTOR_CHECK(out.defined(), name, " forward returned an undefined tensor");
  for (const Tensor& t : used)
    if (t.defined() && out.impl()->storage == t.impl()->storage) {
      out = out.clone();  // an output aliasing an input gets its own history
      break;
    }
  OpDef<OpKind::Function>::Saved saved;
  for (const Tensor& t : A::to_save(*ctx))
    saved.tensors.push_back(save(t.is_same(out) ? out.detach() : t));  // no cycle through the output's own node
  A::to_save(*ctx).clear();
  record_op<OpKind::Function>(used, out, {ctx, std::move(backward), name}, std::move(saved));
  return out;
}

}  // namespace autograd

std::vector<Tensor> OpDef<OpKind::Function>::backward(const Node& node, const Params& p, const Saved& s,
                                                      Tensor diff_dst) {
  using autograd::FunctionAccess;
  std::vector<Tensor>& saved = FunctionAccess::saved(*p.ctx);
  saved.clear();
  for (const SavedTensor& t : s.tensors) saved.push_back(node.unpack(t));
  const amp::AutocastState& state = FunctionAccess::forward_autocast(*p.ctx);
  std::vector<Tensor> grads;
  {
    amp::AutocastGuard autocast(state.dtype, state.enabled, state.cache_enabled);
    grads = p.fn(*p.ctx, diff_dst);
  }
  saved.clear();
  CASTOR_CHECK(grads.size() == node.next.size(), p.name, " backward returned ", grads.size(), " gradients for ",
               node.next.size(), " inputs");
  for (size_t i = 0; i < grads.size(); ++i)
    CASTOR_CHECK(!grads[i].defined() || grads[i].shape() == node.input_shapes[i], p.name, " backward returned ",
                 grads[i].describe(), " for input ", i, " of shape ", shape_str(node.input_shapes[i]));
  return grads;
}

}  // namespace castor
