// User-defined autograd Functions: forward without history, a node whose backward calls the user's, custom_fwd/bwd.
#include "autograd/node.h"
#include "castor/autograd.h"

namespace castor::autograd {

struct FunctionAccess {
  static std::vector<Tensor>& to_save(FunctionCtx& c) { return c.to_save_; }
  static std::vector<Tensor>& saved(FunctionCtx& c) { return c.saved_; }
  static std::vector<bool>& needs_input_grad(FunctionCtx& c) { return c.needs_input_grad_; }
  static amp::AutocastState& forward_autocast(FunctionCtx& c) { return c.forward_autocast_; }
};

namespace {

using A = FunctionAccess;

class UserBackward : public FunctionBackward {
 public:
  UserBackward(std::shared_ptr<FunctionCtx> ctx, BackwardFn fn, std::string name)
      : ctx_(std::move(ctx)), fn_(fn), name_(std::move(name)) {}

  std::vector<Tensor> backward(const Node& node, const Tensor& grad) override {
    std::vector<Tensor>& saved = A::saved(*ctx_);
    saved.clear();
    for (size_t i = 0; i < node.saved.size(); ++i) saved.push_back(node.saved_tensor(i));
    const amp::AutocastState& s = A::forward_autocast(*ctx_);
    std::vector<Tensor> grads;
    {
      amp::AutocastGuard autocast(s.dtype, s.enabled, s.cache_enabled);
      grads = fn_(*ctx_, grad);
    }
    saved.clear();
    CASTOR_CHECK(grads.size() == node.next.size(), name_, " backward returned ", grads.size(), " gradients for ",
                 node.next.size(), " inputs");
    for (size_t i = 0; i < grads.size(); ++i)
      CASTOR_CHECK(!grads[i].defined() || grads[i].shape() == node.input_shapes[i], name_, " backward returned ",
                   grads[i].describe(), " for input ", i, " of shape ", shape_str(node.input_shapes[i]));
    return grads;
  }

 private:
  std::shared_ptr<FunctionCtx> ctx_;
  BackwardFn fn_;
  std::string name_;
};

}  // namespace

Tensor apply_function(ForwardFn forward, BackwardFn backward, const std::vector<Tensor>& inputs,
                      const amp::CustomOp* cast) {
  const std::string name = cast ? "autograd::Function \"" + cast->name() + "\"" : std::string("autograd::Function");
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
  std::vector<Tensor> saved = std::move(A::to_save(*ctx));
  for (Tensor& t : saved)
    if (t.is_same(out)) t = out.detach();  // no cycle through the output's own node
  if (!GradMode::is_enabled() || !any_requires_grad(used)) return out;
  record(OpKind::Function, used, out, std::move(saved));
  out.grad_fn()->function = std::make_shared<UserBackward>(ctx, backward, name);
  return out;
}

}  // namespace castor::autograd
