// Adam and AdamW (optionally AMSGrad): PyTorch 1.13's single-tensor formulas as one fused float32 loop.
#include <cmath>

#include "castor/optim.h"
#include "kernels/ref/loops.h"
#include "optim/rounded_mul.h"

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
void Adam::update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) {
  auto state = [&](const char* name, const Shape& shape) {
    Tensor& t = slot.state[name];
    if (!t.defined()) t = zeros(shape);
    return t.data<float>();
  };
  float* step = state("step", {});
  *step += 1.0f;
  const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(*step));
  const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(*step));
  const float neg_step_size = static_cast<float>(-(group.lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float beta1 = static_cast<float>(options_.beta1), one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float beta2 = static_cast<float>(options_.beta2), one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  const bool decoupled = options_.decoupled_weight_decay, coupled = !decoupled && group.weight_decay != 0;
  const float wd = static_cast<float>(group.weight_decay);
  const float decay_factor = static_cast<float>(1.0 - group.lr * group.weight_decay);
  const bool amsgrad = options_.amsgrad;
  float* p = w.data<float>();
  const float* grad = g.data<float>();
  float* exp_avg = state("exp_avg", w.shape());
  float* exp_avg_sq = state("exp_avg_sq", w.shape());
  float* max_exp_avg_sq = amsgrad ? state("max_exp_avg_sq", w.shape()) : nullptr;
  kernels::parallel_blocks(w.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = coupled ? std::fma(p[i], wd, grad[i]) : grad[i];
      const float wi = decoupled ? rounded_mul(p[i], decay_factor) : p[i];
      const float m = std::fma(gi, one_minus_beta1, exp_avg[i] * beta1);
      const float v = std::fma(one_minus_beta2 * gi, gi, exp_avg_sq[i] * beta2);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      float second = v;
      if (amsgrad) {
        const float old = max_exp_avg_sq[i];
        second = max_exp_avg_sq[i] = (old > v || old != old) ? old : v;  // torch.maximum: NaN wins
      }
      const float denom = std::sqrt(second) / bias_correction2_sqrt + eps;
      p[i] = wi + neg_step_size * m / denom;
    }
    block_updated(p, b, e);
  });
}

}  // namespace castor::optim
