// Dynamic loss scaling (torch.cuda.amp.GradScaler) with hysteresis, scale bounds, skip counters and a scale history.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "castor/optim.h"
#include "castor/state_dict.h"
#include "castor/tensor.h"

namespace castor::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // Unset: on for float16, off for bfloat16 (its float32 exponent range needs no scaling; said once through castor::warn).
  std::optional<bool> enabled;
  DType dtype = DType::Float16;  // the 16-bit type being trained
  bool dynamic = true;           // false: a static scale (Apex loss_scale=<number>); update() changes nothing
  // Beyond PyTorch. hysteresis (DeepSpeed): the scale holds for hysteresis-1 overflows and backs off at the
  // next one. With consecutive_hysteresis a clean step restores the allowance (the overflows must come in a
  // row); without it (DeepSpeed's default) only a growth of the scale does, so scattered overflows add up.
  // The scale stays in [min_scale, max_scale] and is never inf, NaN or 0 (the default floor is the smallest
  // normal float32); raise_at_min_scale (DeepSpeed's raise_error_at_min_scale) makes update() raise when an
  // overflow would back off a scale already at min_scale, instead of skipping steps forever.
  int64_t hysteresis = 1;
  bool consecutive_hysteresis = true;
  double min_scale = 1.1754943508222875e-38;
  double max_scale = 3.4028234663852886e+38;
  bool raise_at_min_scale = false;
  void validate() const;  // throws castor::Error naming the bad option
};

// The loss scale and its bookkeeping; the scale is a float32 value as in PyTorch.
struct ScaleState {
  float scale = 65536.0f;
  int64_t growth_tracker = 0;   // clean steps since the last growth or overflow
  int64_t hysteresis_left = 1;  // overflows still tolerated before backing off
};

// torch._amp_update_scale_ extended with hysteresis and bounds: on overflow back off (unless hysteresis holds
// it), after growth_interval clean steps grow (only if the result stays finite) and restore the hysteresis,
// clamp to [min, max]. Raises (changing nothing) on an overflow at min_scale with raise_at_min_scale.
void update_scale(ScaleState& s, bool found_inf, const GradScalerOptions& o);

// torch._amp_foreach_non_finite_check_and_unscale_: multiplies each gradient in place by inv_scale (computed
// in float32, stored in the gradient's dtype) in one pass that also checks every element; true if any
// element of any gradient was inf or NaN. Gradients may have any strides and float dtypes.
bool non_finite_check_and_unscale_(const std::vector<Tensor>& grads, float inv_scale);

// PyTorch's 1/scale: the reciprocal in float64, rounded to float32.
float inverse_scale(float scale);

// One scale change in the history: after `update` calls to update(), the scale became `scale`.
struct ScaleChange {
  int64_t update;
  double scale;
};

class GradScaler {
 public:
  // `named_params` optionally names parameters for nonfinite_params(); unnamed ones are "group g param i".
  explicit GradScaler(GradScalerOptions options = {}, std::vector<std::pair<std::string, Tensor>> named_params = {});

  bool is_enabled() const { return enabled_; }
  const GradScalerOptions& options() const { return options_; }

  // loss * scale (16-bit losses are widened to float32 first so the product cannot overflow); the loss
  // itself when disabled.
  Tensor scale(const Tensor& loss) const;
  std::vector<Tensor> scale(const std::vector<Tensor>& losses) const;

  // Unscales the optimizer's gradients to float32 (in place for float32 gradients,
  // into the optimizer's float32 buffer for 16-bit ones) and stages them for its step, deciding found_inf.
  // Raises if called twice before update() or after step().
  void unscale_(optim::Optimizer& optimizer);
  // unscale_ and clip_grad_norm_(optimizer, max_norm) (max_norm 0: no clipping) folded into the next step: one
  // read pass over the gradients takes the sum of squares of the unscaled values (the same values and order as
  // clip_grad_norm_'s) and the inf/NaN check, and the step multiplies each gradient by the inverse scale and then
  // the clip coefficient in registers (Optimizer::fold_into_step), so weights, optimizer state and this scaler's
  // state are bit-equal to the unfused calls. The gradients in memory are not rewritten: until the step, .grad
  // holds the scaled gradients (clip_grad_norm_ and master_params then raise). Returns the total norm of the
  // unscaled gradients (0 without clipping). Disabled: clip_grad_norm_ folded alone. Raises as unscale_ does.
  double unscale_clip_(optim::Optimizer& optimizer, double max_norm);
  // Unscales if not yet done, then steps unless a gradient was inf/NaN or `skip_with_others` (another
  // optimizer of the same loss overflowed, as Apex decides) - then tells the optimizer the step was skipped.
  // Returns whether the optimizer stepped. Disabled: a plain step.
  bool step(optim::Optimizer& optimizer, bool skip_with_others = false);
  // Updates the scale from every optimizer's found_inf since the last update (or sets new_scale) and starts
  // a new iteration.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const { return enabled_ ? state_.scale : 1.0; }
  int64_t growth_tracker() const { return state_.growth_tracker; }
  // found_inf of this optimizer since the last update (false if it has not been unscaled).
  bool found_inf(const optim::Optimizer& optimizer) const;
  // Whether unscale_ ran on this optimizer and its step has not yet been taken.
  bool unscaled(const optim::Optimizer& optimizer) const;

  int64_t steps_taken() const { return steps_taken_; }
  int64_t steps_skipped() const { return steps_skipped_; }
  const std::vector<ScaleChange>& scale_history() const { return history_; }
  // The parameters whose gradients were not finite in the latest skipped step (of every optimizer skipped
  // in that iteration).
  const std::vector<std::string>& nonfinite_params() const { return nonfinite_; }

  // "scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker", "hysteresis",
  // "hysteresis_left", "min_scale", "max_scale", "steps_taken", "steps_skipped"; empty when disabled.
  StateDict state_dict() const;
  // Overwrites every entry; raises on an empty dict (saved from a disabled scaler) or a missing key.
  void load_state_dict(const StateDict& sd);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool found_inf = false;
    bool any_grad = false;
    std::vector<std::pair<int, int>> nonfinite;  // (group, slot) of each non-finite gradient
  };
  std::string param_name(const optim::Optimizer& opt, int group, int slot) const;
  // The one place the step decision is made from this process's inf/NaN check; with more than one rank
  // (castor::dist) the flag is all-reduced (max), so that every rank skips together and keeps the same scale.
  bool decide_found_inf(bool local_found_inf) const;

  GradScalerOptions options_;
  bool enabled_;
  ScaleState state_;
  std::map<const optim::Optimizer*, PerOptimizer> per_opt_;
  std::map<const TensorImpl*, std::string> names_;
  int64_t updates_ = 0, steps_taken_ = 0, steps_skipped_ = 0;
  bool skipped_this_iteration_ = false;
  std::vector<ScaleChange> history_;
  std::vector<std::string> nonfinite_;
};

// torch.nn.utils.clip_grad_norm_ on the gradients the next step will use (optim::step_grads: unscaled first
// when amp::initialize set the optimizer up, the staged float32 ones after unscale_, else .grad): scales them
// to a total 2-norm of at most max_norm and returns the total norm before clipping. `params` may be model
// parameters, at any opt level, or amp::master_params(optimizer). On a sharded optimizer (ZeRO) each rank sums its
// slice of each gradient and the sums are all-reduced: every rank gets the whole norm and the same coefficient (a
// collective: every rank calls it).
double clip_grad_norm_(optim::Optimizer& optimizer, double max_norm);
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace castor::amp

// Where PyTorch users look for it (torch.nn.utils.clip_grad_norm_). It lives with the scaler because after
// unscale_ it clips the float32 gradients the optimizer stages, which the nn layer does not know about.
namespace castor::nn::utils {
using amp::clip_grad_norm_;
}  // namespace castor::nn::utils
