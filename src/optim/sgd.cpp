// SGD with momentum, dampening, Nesterov and weight decay: PyTorch 1.13's single-tensor formulas scalars here, the fused loop in kernels.
#include <cmath>

#include "castor/optim.h"
#include "core/parallel.h"
#include "optim/write_back.h"

namespace castor::optim {

void SGDOptions::validate() const {
  CASTOR_CHECK(lr >= 0, "SGD: invalid lr ", lr, " (must be >= 0)");
  CASTOR_CHECK(momentum >= 0, "SGD: invalid momentum ", momentum, " (must be >= 0)");
  CASTOR_CHECK(weight_decay >= 0, "SGD: invalid weight_decay ", weight_decay, " (must be >= 0)");
  CASTOR_CHECK(!nesterov || (momentum > 0 && dampening == 0),
               "SGD: nesterov requires a momentum and zero dampening (momentum ", momentum, ", dampening ", dampening,
               ")");
}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options) : options_(options) {
  options_.validate();
  add_param_group(params, options_.lr, options_.weight_decay);
}

// d = g + wd * w; buf = d on the first step, else momentum * buf + (1 - dampening) * d;
// d = nesterov ? d + momentum * buf : buf; w -= lr * d. Scalars are rounded to float32 like PyTorch's.
BlockPass SGD::update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) {
  kernels::SgdUpdate u{.neg_lr = static_cast<float>(-group.lr),
                       .weight_decay = static_cast<float>(group.weight_decay),
                       .momentum = static_cast<float>(options_.momentum),
                       .keep = static_cast<float>(1.0 - options_.dampening),
                       .decay = group.weight_decay != 0,
                       .first = false,
                       .nesterov = options_.nesterov,
                       .grad_inv_scale = grad_inv_scale_,
                       .grad_clip = grad_clip_};
  float* buf = nullptr;
  if (options_.momentum != 0) {
    auto it = slot.state.find("momentum_buffer");
    u.first = it == slot.state.end();
    if (u.first) it = slot.state.emplace("momentum_buffer", empty(w.shape())).first;
    buf = it->second.data<float>();
  }
  float* wp = w.data<float>();
  const float* gp = g.data<float>();
  return {w.numel(), kBlock, [u, wp, gp, buf, wb = take_write_back()](int64_t b, int64_t e) {
            kernels::sgd_update(u, b, e, wp, gp, buf, round_into(wb));
          }};
}

}  // namespace castor::optim
