// The optimizers' fused float32 update loops (Adam/AdamW with AMSGrad, SGD with momentum): one pass per parameter.
#include <cmath>

#include "core/parallel.h"
#include "core/rounded_mul.h"
#include "kernels/kernels.h"

namespace castor::kernels {

void adam_update(const AdamUpdate& u, int64_t n, float* w, const float* g, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, const RoundInto& into) {
  parallel_blocks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = u.coupled ? std::fma(w[i], u.weight_decay, g[i]) : g[i];
      const float wi = u.decoupled ? rounded_mul(w[i], u.decay_factor) : w[i];
      const float m = std::fma(gi, u.one_minus_beta1, exp_avg[i] * u.beta1);
      const float v = std::fma(u.one_minus_beta2 * gi, gi, exp_avg_sq[i] * u.beta2);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      float second = v;
      if (max_exp_avg_sq) {
        const float old = max_exp_avg_sq[i];
        second = max_exp_avg_sq[i] = (old > v || old != old) ? old : v;  // torch.maximum: NaN wins
      }
      const float denom = std::sqrt(second) / u.bias_correction2_sqrt + u.eps;
      w[i] = wi + u.neg_step_size * m / denom;
    }
    round_block_into_16bit(w, into, b, e);
  });
}

void sgd_update(const SgdUpdate& u, int64_t n, float* w, const float* g, float* momentum_buffer,
                const RoundInto& into) {
  parallel_blocks(n, [&](int64_t b, int64_t e) {
    if (!momentum_buffer) {
      for (int64_t i = b; i < e; ++i) w[i] = std::fma(u.decay ? std::fma(w[i], u.weight_decay, g[i]) : g[i], u.neg_lr, w[i]);
    } else {
      for (int64_t i = b; i < e; ++i) {
        const float d = u.decay ? std::fma(w[i], u.weight_decay, g[i]) : g[i];
        const float m = u.first ? d : std::fma(d, u.keep, momentum_buffer[i] * u.momentum);
        momentum_buffer[i] = m;
        w[i] = std::fma(u.nesterov ? std::fma(m, u.momentum, d) : m, u.neg_lr, w[i]);
      }
    }
    round_block_into_16bit(w, into, b, e);
  });
}

}  // namespace castor::kernels
