// The optimizers' fused float32 update loops (Adam/AdamW with AMSGrad, SGD with momentum), one block at a time.
#include <immintrin.h>

#include <cmath>

#include "core/parallel.h"
#include "core/rounded_mul.h"
#include "kernels/kernels.h"

namespace castor::kernels {

namespace {

// Adam without AMSGrad over [b, e) on 8 AVX2 lanes (the build's baseline): the scalar loop's operations one for
// one (the same fused multiply-adds, separately rounded products, correctly rounded sqrt and divisions), so the
// same bits; returns where the scalar loop takes over.
int64_t adam_update_avx2(const AdamUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* exp_avg,
                         float* exp_avg_sq) {
  const __m256 wd = _mm256_set1_ps(u.weight_decay), decay = _mm256_set1_ps(u.decay_factor);
  const __m256 b1 = _mm256_set1_ps(u.beta1), omb1 = _mm256_set1_ps(u.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(u.beta2), omb2 = _mm256_set1_ps(u.one_minus_beta2);
  const __m256 bc2 = _mm256_set1_ps(u.bias_correction2_sqrt), eps = _mm256_set1_ps(u.eps);
  const __m256 neg_step = _mm256_set1_ps(u.neg_step_size), neg_zero = _mm256_set1_ps(-0.0f);
  const __m256 inv = _mm256_set1_ps(u.grad_inv_scale), clip = _mm256_set1_ps(u.grad_clip);
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 wv = _mm256_loadu_ps(w + i), gv = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), inv), clip);
    const __m256 gi = u.coupled ? _mm256_fmadd_ps(wv, wd, gv) : gv;
    const __m256 wi = u.decoupled ? _mm256_fmadd_ps(wv, decay, neg_zero) : wv;
    const __m256 m = _mm256_fmadd_ps(gi, omb1, _mm256_mul_ps(_mm256_loadu_ps(exp_avg + i), b1));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), b2));
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
    _mm256_storeu_ps(w + i, _mm256_add_ps(wi, _mm256_div_ps(_mm256_mul_ps(neg_step, m), denom)));
  }
  return i;
}

// SGD over [b, e) on 8 AVX2 lanes, the scalar loop's operations one for one; returns where the scalar loop takes over.
int64_t sgd_update_avx2(const SgdUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* momentum_buffer) {
  const __m256 inv = _mm256_set1_ps(u.grad_inv_scale), clip = _mm256_set1_ps(u.grad_clip);
  const __m256 wd = _mm256_set1_ps(u.weight_decay), momentum = _mm256_set1_ps(u.momentum);
  const __m256 keep = _mm256_set1_ps(u.keep), neg_lr = _mm256_set1_ps(u.neg_lr);
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 wv = _mm256_loadu_ps(w + i);
    const __m256 gi = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), inv), clip);
    const __m256 d = u.decay ? _mm256_fmadd_ps(wv, wd, gi) : gi;
    __m256 step = d;
    if (momentum_buffer) {
      const __m256 m = u.first
                           ? d
                           : _mm256_fmadd_ps(d, keep, _mm256_mul_ps(_mm256_loadu_ps(momentum_buffer + i), momentum));
      _mm256_storeu_ps(momentum_buffer + i, m);
      step = u.nesterov ? _mm256_fmadd_ps(m, momentum, d) : m;
    }
    _mm256_storeu_ps(w + i, _mm256_fmadd_ps(step, neg_lr, wv));
  }
  return i;
}

}  // namespace

void adam_update(const AdamUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, const RoundInto& into) {
  const int64_t vectorised = max_exp_avg_sq ? b : adam_update_avx2(u, b, e, w, g, exp_avg, exp_avg_sq);
  for (int64_t i = vectorised; i < e; ++i) {
    const float gu = g[i] * u.grad_inv_scale * u.grad_clip;
    const float gi = u.coupled ? std::fma(w[i], u.weight_decay, gu) : gu;
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
}

void sgd_update(const SgdUpdate& u, int64_t b, int64_t e, float* w, const float* g, float* momentum_buffer,
                const RoundInto& into) {
  const int64_t vectorised = sgd_update_avx2(u, b, e, w, g, momentum_buffer);
  if (!momentum_buffer) {
    for (int64_t i = vectorised; i < e; ++i) {
      const float gi = g[i] * u.grad_inv_scale * u.grad_clip;
      w[i] = std::fma(u.decay ? std::fma(w[i], u.weight_decay, gi) : gi, u.neg_lr, w[i]);
    }
  } else {
    for (int64_t i = vectorised; i < e; ++i) {
      const float gi = g[i] * u.grad_inv_scale * u.grad_clip;
      const float d = u.decay ? std::fma(w[i], u.weight_decay, gi) : gi;
      const float m = u.first ? d : std::fma(d, u.keep, momentum_buffer[i] * u.momentum);
      momentum_buffer[i] = m;
      w[i] = std::fma(u.nesterov ? std::fma(m, u.momentum, d) : m, u.neg_lr, w[i]);
    }
  }
  round_block_into_16bit(w, into, b, e);
}

}  // namespace castor::kernels
