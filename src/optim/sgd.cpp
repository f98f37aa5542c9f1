// SGD with momentum, dampening, Nesterov and weight decay: PyTorch 1.13's single-tensor formulas as one fused float32 loop.
#include <cmath>

#include "castor/optim.h"
#include "kernels/ref/loops.h"

namespace castor::optim {

void SGDOptions::validate() const {
  CASTOR_CHECK(lr >= 0, "SGD: invalid lr ", lr, " (must be >= 0)");
  CASTOR_CHECK(momentum >= 0, "SGD: invalid momentum ", momentum, " (must be >= 0)");
  CASTOR_CHECK(weight_decay >= 0, "SGD: invalid weight_decay ", weight_decay, " (must be >= 0)");
  CASTOR_CHECK(!nesterov || (momentum > 0 && dampening == 0),
               "SGD: nesterov requires a momentum and zero dampening (momentum ", momentum, ", dampening ", dampening, ")");
}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options) : options_(options) {
  options_.validate();
  add_param_group(params, options_.lr, options_.weight_decay);
}

// d = g + wd * w; buf = d on the first step, else momentum * buf + (1 - dampening) * d;
// d = nesterov ? d + momentum * buf : buf; w -= lr * d. Scalars are rounded to float32 like PyTorch's.
void SGD::update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) {
  float* p = w.data<float>();
  const float* grad = g.data<float>();
  const bool decay = group.weight_decay != 0;
  const float wd = static_cast<float>(group.weight_decay), neg_lr = static_cast<float>(-group.lr);
  if (options_.momentum == 0) {
    kernels::parallel_blocks(w.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float d = decay ? std::fma(p[i], wd, grad[i]) : grad[i];
        p[i] = std::fma(d, neg_lr, p[i]);
      }
      block_updated(p, b, e);
    });
    return;
  }
  auto it = slot.state.find("momentum_buffer");
  const bool first = it == slot.state.end();
  if (first) it = slot.state.emplace("momentum_buffer", empty(w.shape())).first;
  float* buf = it->second.data<float>();
  const float momentum = static_cast<float>(options_.momentum), keep = static_cast<float>(1.0 - options_.dampening);
  const bool nesterov = options_.nesterov;
  kernels::parallel_blocks(w.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float d = decay ? std::fma(p[i], wd, grad[i]) : grad[i];
      const float m = first ? d : std::fma(d, keep, buf[i] * momentum);
      buf[i] = m;
      p[i] = std::fma(nesterov ? std::fma(m, momentum, d) : m, neg_lr, p[i]);
    }
    block_updated(p, b, e);
  });
}

}  // namespace castor::optim
