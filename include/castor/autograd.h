// Reverse-mode autograd: grad mode, the backward engine's entry points.
#pragma once
#include <vector>

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

}  // namespace castor
