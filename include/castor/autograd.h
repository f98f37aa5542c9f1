// Reverse-mode autograd: grad mode, the backward engine's entry points, user-defined differentiable functions.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "castor/autocast.h"
#include "castor/tensor.h"

namespace castor {

// Thread-local switch: when off, ops record no history (torch.no_grad).
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Runs backward from `outputs` (each scalar unless its gradient is given), accumulating into leaves' .grad.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false, bool create_graph = false);

// Returns d(outputs)/d(inputs) without touching .grad (torch.autograd.grad). With create_graph the
// result has history, so it can be differentiated again (e.g. a gradient penalty).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool create_graph = false);

namespace autograd {

// Runs `callback` once the backward in progress has finished (PyTorch's Variable._execution_engine.queue_callback),
// after every gradient has been accumulated; callbacks run in the order queued. Raises outside a backward.
void queue_callback(std::function<void()> callback);

// What a Function's forward hands its backward (PyTorch's ctx).
class FunctionCtx {
 public:
  // Tensors for backward; an in-place change to one before backward is an error there, as in PyTorch.
  void save_for_backward(std::vector<Tensor> tensors) { to_save_ = std::move(tensors); }
  // In backward: the saved tensors.
  const std::vector<Tensor>& saved_tensors() const { return saved_; }
  // In forward and backward: whether each input needs a gradient.
  const std::vector<bool>& needs_input_grad() const { return needs_input_grad_; }

 private:
  friend struct FunctionAccess;
  std::vector<Tensor> to_save_, saved_;
  std::vector<bool> needs_input_grad_;
  amp::AutocastState forward_autocast_;  // the autocast state forward ran under (custom_bwd restores it)
};

// A Function's forward and backward: its static members, or closures (nn::checkpoint's carry the function to rerun).
using ForwardFn = std::function<Tensor(FunctionCtx&, const std::vector<Tensor>&)>;
using BackwardFn = std::function<std::vector<Tensor>(FunctionCtx&, const Tensor&)>;

// Runs a Function (see below); `cast` is its registered autocast policy or nullptr; `name` names it in errors
// (default: autograd::Function, with the autocast name when there is one).
Tensor apply_function(const ForwardFn& forward, BackwardFn backward, const std::vector<Tensor>& inputs,
                      const amp::CustomOp* cast, const std::string& name = "");

// A user-defined differentiable op, torch.autograd.Function with torch.cuda.amp's custom_fwd/custom_bwd:
//   struct Cube : autograd::Function<Cube> {
//     static inline const amp::CustomOp autocast_op = amp::register_op("cube", CastPolicy::Float32);  // optional
//     static Tensor forward(autograd::FunctionCtx& ctx, const std::vector<Tensor>& in) {
//       ctx.save_for_backward({in[0]});
//       return mul(mul(in[0], in[0]), in[0]);
//     }
//     static std::vector<Tensor> backward(autograd::FunctionCtx& ctx, const Tensor& grad) {
//       const Tensor& x = ctx.saved_tensors()[0];
//       return {mul(grad, mul(mul(x, x), 3.0))};
//     }
//   };
//   Tensor y = Cube::apply({x});
// forward runs without recording history; backward returns one gradient per input (undefined where none is
// needed), which the engine casts to that input's dtype. With an `autocast_op` member, autocast casts the inputs
// by its policy and forward runs with autocast off (custom_fwd(cast_inputs=...)); without one, forward runs
// under the caller's autocast state (custom_fwd). backward runs under the autocast state forward ran under
// (custom_bwd).
template <class F>
struct Function {
  static Tensor apply(const std::vector<Tensor>& inputs) {
    if constexpr (requires { F::autocast_op; })
      return apply_function(&F::forward, &F::backward, inputs, &F::autocast_op);
    else
      return apply_function(&F::forward, &F::backward, inputs, nullptr);
  }
};

}  // namespace autograd

}  // namespace castor
