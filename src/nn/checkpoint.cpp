// nn::checkpoint: activation recompute as a user-defined autograd Function whose backward reruns the function under
// the first run's autocast and generator state and back-propagates through the rebuilt graph.
#include <memory>

#include "castor/autograd.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/random.h"

namespace castor::nn {

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                  std::function<void()> after_backward) {
  if (!GradMode::is_enabled()) return fn(inputs);
  // The generator as the first run found it: the rerun draws the same dropout masks.
  const Generator::State rng = default_generator().state();
  std::vector<Tensor> args = inputs;
  // A Function records a node only when an input requires grad; where none does, an empty leaf that does stands in,
  // so that the parameters inside fn still get their gradients.
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) args.push_back(empty({0}).requires_grad_(true));
  const size_t n_inputs = inputs.size();
  auto forward = [fn, n_inputs](autograd::FunctionCtx& ctx, const std::vector<Tensor>& in) {
    ctx.save_for_backward(in);
    return fn(std::vector<Tensor>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n_inputs)));
  };
  // Runs under the autocast state forward ran under (the Function's custom_bwd).
  auto backward = [fn, n_inputs, rng, after_backward](autograd::FunctionCtx& ctx, const Tensor& grad) {
    const std::vector<Tensor>& saved = ctx.saved_tensors();
    std::vector<Tensor> detached;  // leaves standing for the inputs, their gradients gathered in .grad
    for (size_t i = 0; i < n_inputs; ++i) {
      Tensor d = saved[i].defined() ? saved[i].detach() : Tensor();
      if (d.defined() && ctx.needs_input_grad()[i]) d.requires_grad_(true);
      detached.push_back(d);
    }
    Tensor out;
    {
      Generator& gen = default_generator();
      const Generator::State now = gen.state();
      gen.set_state(rng);
      struct Restore {
        Generator& gen;
        Generator::State state;
        bool grad_mode;
        ~Restore() {
          gen.set_state(state);
          GradMode::set_enabled(grad_mode);
        }
      } restore{gen, now, GradMode::is_enabled()};
      GradMode::set_enabled(true);
      out = fn(detached);
    }
    if (out.requires_grad()) {
      // As a plain backward would run these rules: outside autocast (torch.utils.checkpoint leaves its autocast
      // region before its inner backward).
      amp::AutocastGuard off(amp::autocast_state().dtype, /*enabled=*/false);
      castor::backward({out}, {grad});
    }
    std::vector<Tensor> grads;
    for (const Tensor& d : detached) grads.push_back(d.defined() && d.requires_grad() ? d.grad() : Tensor());
    grads.resize(saved.size());  // the stand-in leaf's: none
    out = Tensor();
    if (after_backward) after_backward();
    return grads;
  };
  return autograd::apply_function(forward, backward, args, nullptr, "checkpoint");
}

}  // namespace castor::nn
