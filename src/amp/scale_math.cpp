// The loss-scale arithmetic: the scale update, option validation, the foreach unscale entry point.
#include <algorithm>
#include <cmath>
#include <vector>

#include "castor/grad_scaler.h"

#include "kernels/kernels.h"

namespace castor::amp {

void GradScalerOptions::validate() const {
  CASTOR_CHECK(std::isfinite(init_scale) && init_scale > 0, "GradScaler: init_scale must be finite and > 0, got ",
               init_scale);
  CASTOR_CHECK(std::isfinite(growth_factor) && growth_factor > 1, "GradScaler: growth_factor must be > 1, got ",
               growth_factor);
  CASTOR_CHECK(backoff_factor > 0 && backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
               backoff_factor);
  CASTOR_CHECK(growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", growth_interval);
  CASTOR_CHECK(hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", hysteresis);
  CASTOR_CHECK(min_scale > 0 && min_scale <= max_scale && max_scale <= 3.4028234663852886e+38,
               "GradScaler: need 0 < min_scale <= max_scale <= float32 max, got min_scale ", min_scale,
               " and max_scale ", max_scale);
  CASTOR_CHECK(dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32,
               "GradScaler: dtype must be float16, bfloat16 or float32, got ", dtype_name(dtype));
}

void update_scale(ScaleState& s, bool found_inf, const GradScalerOptions& o) {
  if (found_inf) {
    CASTOR_CHECK(!o.raise_at_min_scale || s.hysteresis_left > 1 || static_cast<double>(s.scale) > o.min_scale,
                 "GradScaler: gradients overflowed with the loss scale already at min_scale ", o.min_scale,
                 " (raise_at_min_scale); the run cannot recover by scaling");
    s.growth_tracker = 0;
    if (s.hysteresis_left > 1) {
      --s.hysteresis_left;
      return;
    }
    s.scale = static_cast<float>(
        std::max(static_cast<double>(s.scale * static_cast<float>(o.backoff_factor)), o.min_scale));
    return;
  }
  if (o.consecutive_hysteresis) s.hysteresis_left = o.hysteresis;
  if (++s.growth_tracker < o.growth_interval) return;
  s.hysteresis_left = o.hysteresis;
  const float grown = s.scale * static_cast<float>(o.growth_factor);
  if (std::isfinite(grown)) s.scale = static_cast<float>(std::min(static_cast<double>(grown), o.max_scale));
  s.growth_tracker = 0;
}

float inverse_scale(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

bool non_finite_check_and_unscale_(const std::vector<Tensor>& grads, float inv_scale) {
  bool found = false;
  for (const Tensor& g : grads)
    if (g.defined()) found |= kernels::unscale(g, g, inv_scale);
  return found;
}

}  // namespace castor::amp
