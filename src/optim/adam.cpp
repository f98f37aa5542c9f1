// Adam and AdamW (optionally AMSGrad): PyTorch 1.13's single-tensor formulas, scalars here, the fused loop in kernels.
#include <cmath>

#include "castor/optim.h"
#include "core/parallel.h"
#include "optim/adam_scalars.h"
#include "optim/write_back.h"

namespace castor::optim {

void AdamOptions::validate() const {
  CASTOR_CHECK(lr >= 0, "Adam: invalid lr ", lr, " (must be >= 0)");
  CASTOR_CHECK(eps >= 0, "Adam: invalid eps ", eps, " (must be >= 0)");
  CASTOR_CHECK(beta1 >= 0 && beta1 < 1, "Adam: invalid beta1 ", beta1, " (must be in [0, 1))");
  CASTOR_CHECK(beta2 >= 0 && beta2 < 1, "Adam: invalid beta2 ", beta2, " (must be in [0, 1))");
  CASTOR_CHECK(weight_decay >= 0, "Adam: invalid weight_decay ", weight_decay, " (must be >= 0)");
}

AdamOptions AdamOptions::adamw() {
  AdamOptions o;
  o.weight_decay = 1e-2;
  o.decoupled_weight_decay = true;
  return o;
}

Adam::Adam(const std::vector<Tensor>& params, AdamOptions options) : options_(options) {
  options_.validate();
  add_param_group(params, options_.lr, options_.weight_decay);
}

std::unique_ptr<Adam> make_adamw(const std::vector<Tensor>& params, AdamOptions options) {
  options.decoupled_weight_decay = true;
  return std::make_unique<Adam>(params, options);
}

// step += 1; Adam: g += wd * w; AdamW: w *= 1 - lr * wd; m = beta1 * m + (1 - beta1) * g;
// v = beta2 * v + (1 - beta2) * g * g; (AMSGrad: v_max = max(v_max, v), used for v);
// w += -(lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
// The bias corrections are computed in double and every scalar rounded to float32, as PyTorch does; the fused
// multiply-adds are where PyTorch's kernels use them (add with alpha, addcmul), so results match bit for bit.
kernels::AdamUpdate adam_scalars(const AdamScalars& a, double lr, double weight_decay, float step) {
  const double bias_correction1 = 1 - std::pow(a.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(a.beta2, static_cast<double>(step));
  return {.neg_step_size = static_cast<float>(-(lr / bias_correction1)),
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
          .beta1 = static_cast<float>(a.beta1),
          .one_minus_beta1 = static_cast<float>(1.0 - a.beta1),
          .beta2 = static_cast<float>(a.beta2),
          .one_minus_beta2 = static_cast<float>(1.0 - a.beta2),
          .eps = static_cast<float>(a.eps),
          .weight_decay = static_cast<float>(weight_decay),
          .decay_factor = static_cast<float>(1.0 - lr * weight_decay),
          .coupled = !a.decoupled && weight_decay != 0,
          .decoupled = a.decoupled};
}

BlockPass Adam::update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) {
  auto state = [&](const char* name, const Shape& shape) {
    Tensor& t = slot.state[name];
    if (!t.defined()) t = zeros(shape);
    return t.data<float>();
  };
  float* step = state("step", {});
  *step += 1.0f;
  kernels::AdamUpdate u = adam_scalars({options_.beta1, options_.beta2, options_.eps, options_.decoupled_weight_decay},
                                       group.lr, group.weight_decay, *step);
  u.grad_inv_scale = grad_inv_scale_;
  u.grad_clip = grad_clip_;
  float* m = state("exp_avg", w.shape());
  float* v = state("exp_avg_sq", w.shape());
  float* v_max = options_.amsgrad ? state("max_exp_avg_sq", w.shape()) : nullptr;
  float* wp = w.data<float>();
  const float* gp = g.data<float>();
  return {w.numel(), kBlock, [u, wp, gp, m, v, v_max, wb = take_write_back()](int64_t b, int64_t e) {
            kernels::adam_update(u, b, e, wp, gp, m, v, v_max, round_into(wb));
          }};
}

}  // namespace castor::optim
