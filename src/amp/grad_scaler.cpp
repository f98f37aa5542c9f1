// GradScaler: scale, fused unscale into float32 staged gradients, skip on inf/NaN, dynamic scale updates.
#include "castor/grad_scaler.h"

#include <atomic>
#include <cmath>
#include "castor/log.h"

#include "kernels/kernels.h"
#include "castor/autograd.h"
#include "castor/dist.h"
#include "castor/ops.h"

namespace castor::amp {

namespace {

// clip_grad_norm_'s factor for a total norm: max_norm / (norm + 1e-6) when that is below 1, else 1.
double clip_coefficient(double total_norm, double max_norm) {
  const double coef = max_norm / (total_norm + 1e-6);
  return coef < 1 ? coef : 1.0;
}

// A float32 gradient may be unscaled in place unless some of its elements share memory (expanded dims).
bool in_place_ok(const Tensor& g) {
  if (g.dtype() != DType::Float32) return false;
  for (int64_t d = 0; d < g.dim(); ++d)
    if (g.stride(d) == 0 && g.size(d) > 1) return false;
  return true;
}

double get_f64(const StateDict& sd, const std::string& key) {
  auto it = sd.find(key);
  CASTOR_CHECK(it != sd.end(), "GradScaler::load_state_dict: missing entry \"", key, "\"");
  CASTOR_CHECK(it->second.numel() == 1, "GradScaler::load_state_dict: entry \"", key, "\" is ", it->second.describe(),
               ", expected one element");
  return it->second.item();
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, std::vector<std::pair<std::string, Tensor>> named_params)
    : options_(options) {
  options_.validate();
  if (options_.enabled) {
    enabled_ = *options_.enabled;
  } else {
    enabled_ = options_.dtype == DType::Float16;
    static std::atomic<bool> said{false};
    if (options_.dtype == DType::BFloat16 && !said.exchange(true))
      warn(
          "GradScaler is off for bfloat16: its exponent range is float32's, so gradients do not underflow and "
          "the scale stays 1 (GradScalerOptions::enabled = true scales anyway)");
  }
  state_.scale = static_cast<float>(options_.init_scale);
  state_.hysteresis_left = options_.hysteresis;
  history_.push_back({0, state_.scale});
  for (auto& [name, t] : named_params) names_[t.impl()] = name;
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!enabled_) return loss;
  const Tensor wide = is_16bit_float(loss.dtype()) ? loss.to(DType::Float32) : loss;
  return mul(wide, static_cast<double>(state_.scale));
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& losses) const {
  std::vector<Tensor> out;
  out.reserve(losses.size());
  for (const Tensor& l : losses) out.push_back(scale(l));
  return out;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  PerOptimizer& st = per_opt_[&optimizer];
  CASTOR_CHECK(st.stage != Stage::Unscaled,
               "GradScaler::unscale_: already called on this optimizer since the last update()");
  CASTOR_CHECK(st.stage != Stage::Stepped, "GradScaler::unscale_: called after step(); call update() first");
  const float inv = inverse_scale(state_.scale);
  st.nonfinite.clear();
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].slots.size(); ++i) {
      optim::ParamSlot& slot = groups[g].slots[i];
      // (ZeRO-2 drops .grad and stages each rank's float32 slice of the gradient)
      const Tensor grad = slot.param.grad().defined() ? slot.param.grad() : slot.staged_grad();
      if (!grad.defined()) continue;
      st.any_grad = true;
      const Tensor dst = in_place_ok(grad) ? grad : optimizer.float32_grad_buffer(g, i);
      if (kernels::unscale(grad, dst, inv)) st.nonfinite.emplace_back(static_cast<int>(g), static_cast<int>(i));
      optimizer.stage_float32_grad(g, i, dst);
    }
  }
  st.found_inf = decide_found_inf(!st.nonfinite.empty());
  st.stage = Stage::Unscaled;
}

double GradScaler::unscale_clip_(optim::Optimizer& optimizer, double max_norm) {
  CASTOR_CHECK(max_norm >= 0, "GradScaler::unscale_clip_: max_norm must be >= 0 (0: no clipping), got ", max_norm);
  PerOptimizer* st = nullptr;
  if (enabled_) {
    st = &per_opt_[&optimizer];
    CASTOR_CHECK(st->stage != Stage::Unscaled,
                 "GradScaler::unscale_clip_: already unscaled on this optimizer since the last update()");
    CASTOR_CHECK(st->stage != Stage::Stepped, "GradScaler::unscale_clip_: called after step(); call update() first");
  }
  const float inv = enabled_ ? inverse_scale(state_.scale) : 1.0f;
  std::vector<std::pair<int, int>> nonfinite;
  bool any_grad = false;
  double total = 0;
  dist::ProcessGroup* sharded = optimizer.shard_group();
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].slots.size(); ++i) {
      const optim::ParamSlot& slot = groups[g].slots[i];
      Tensor grad = slot.staged_grad().defined() ? slot.staged_grad() : slot.param.grad();
      if (!grad.defined()) continue;
      // Sharded (ZeRO), each rank checks and sums its slice of every gradient; the ranks add their sums below.
      if (sharded && grad.shape() == slot.param.shape())
        grad = grad.contiguous().view({-1}).narrow(0, slot.shard.begin, slot.shard.length);
      CASTOR_CHECK(grad.dtype() != DType::Float64, "GradScaler::unscale_clip_: a float64 gradient (",
                   param_name(optimizer, static_cast<int>(g), static_cast<int>(i)), "); use unscale_");
      any_grad = true;
      bool bad = false;
      total += kernels::sum_of_squares(grad, inv, &bad);
      if (bad) nonfinite.emplace_back(static_cast<int>(g), static_cast<int>(i));
    }
  if (st) {
    st->nonfinite = nonfinite;
    st->any_grad |= any_grad;
    st->found_inf = decide_found_inf(!nonfinite.empty());
    st->stage = Stage::Unscaled;
  }
  if (sharded) {  // the norm over every rank's slices, the same on every rank (found_inf is agreed above)
    Tensor t = scalar_tensor(total, DType::Float64);
    sharded->all_reduce(t);
    total = t.item();
  }
  total = std::sqrt(total);
  const double coef = max_norm > 0 ? clip_coefficient(total, max_norm) : 1.0;
  optimizer.fold_into_step(inv, static_cast<float>(coef));
  return max_norm > 0 ? total : 0.0;
}

bool GradScaler::decide_found_inf(bool local_found_inf) const {
  if (dist::world_size() == 1) return local_found_inf;
  // Every rank skips the step (and backs off the scale) when any rank saw inf/NaN (DeepSpeed's overflow all-reduce).
  Tensor flag = scalar_tensor(local_found_inf ? 1.0 : 0.0, DType::Float32);
  dist::all_reduce(flag, dist::ReduceOp::Max);
  return flag.item() != 0.0;
}

bool GradScaler::unscaled(const optim::Optimizer& optimizer) const {
  auto it = per_opt_.find(&optimizer);
  return it != per_opt_.end() && it->second.stage == Stage::Unscaled;
}

std::string GradScaler::param_name(const optim::Optimizer& opt, int group, int slot) const {
  auto it = names_.find(opt.param_groups()[group].slots[slot].param.impl());
  if (it != names_.end()) return it->second;
  return "group " + std::to_string(group) + " param " + std::to_string(slot);
}

bool GradScaler::step(optim::Optimizer& optimizer, bool skip_with_others) {
  if (!enabled_) {
    optimizer.apply_step();
    ++steps_taken_;
    return true;
  }
  PerOptimizer& st = per_opt_[&optimizer];
  CASTOR_CHECK(st.stage != Stage::Stepped,
               "GradScaler::step: already called on this optimizer since the last "
               "update()");
  if (st.stage == Stage::Ready) unscale_(optimizer);
  CASTOR_CHECK(st.any_grad,
               "GradScaler::step: no inf checks were recorded for this optimizer (no parameter has a "
               "gradient)");
  st.stage = Stage::Stepped;
  const bool skip = st.found_inf || skip_with_others;
  if (skip) {
    if (!skipped_this_iteration_) nonfinite_.clear();
    skipped_this_iteration_ = true;
    for (auto [g, i] : st.nonfinite) nonfinite_.push_back(param_name(optimizer, g, i));
    optimizer.note_skipped_step();
    ++steps_skipped_;
  } else {
    optimizer.apply_step();
    ++steps_taken_;
  }
  optimizer.clear_staged_grads();
  return !skip;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale) {
    CASTOR_CHECK(std::isfinite(*new_scale) && *new_scale > 0,
                 "GradScaler::update: new_scale must be finite and > 0, "
                 "got ",
                 *new_scale);
    state_.scale = static_cast<float>(*new_scale);
  } else if (options_.dynamic) {
    bool recorded = false, found = false;
    for (auto& [opt, st] : per_opt_) {
      recorded |= st.stage != Stage::Ready;
      found |= st.found_inf;
    }
    CASTOR_CHECK(recorded,
                 "GradScaler::update: no inf checks were recorded prior to update() (call step() or "
                 "unscale_() first)");
    update_scale(state_, found, options_);
  }
  ++updates_;
  if (state_.scale != history_.back().scale) history_.push_back({updates_, state_.scale});
  per_opt_.clear();
  skipped_this_iteration_ = false;
}

bool GradScaler::found_inf(const optim::Optimizer& optimizer) const {
  auto it = per_opt_.find(&optimizer);
  return it != per_opt_.end() && it->second.found_inf;
}

StateDict GradScaler::state_dict() const {
  if (!enabled_) return {};
  return {{"scale", scalar_tensor(state_.scale, DType::Float32)},
          {"growth_factor", scalar_tensor(options_.growth_factor, DType::Float64)},
          {"backoff_factor", scalar_tensor(options_.backoff_factor, DType::Float64)},
          {"growth_interval", scalar_tensor(static_cast<double>(options_.growth_interval), DType::Int64)},
          {"growth_tracker", scalar_tensor(static_cast<double>(state_.growth_tracker), DType::Int64)},
          {"hysteresis", scalar_tensor(static_cast<double>(options_.hysteresis), DType::Int64)},
          {"hysteresis_left", scalar_tensor(static_cast<double>(state_.hysteresis_left), DType::Int64)},
          {"min_scale", scalar_tensor(options_.min_scale, DType::Float64)},
          {"max_scale", scalar_tensor(options_.max_scale, DType::Float64)},
          {"steps_taken", scalar_tensor(static_cast<double>(steps_taken_), DType::Int64)},
          {"steps_skipped", scalar_tensor(static_cast<double>(steps_skipped_), DType::Int64)}};
}

void GradScaler::load_state_dict(const StateDict& sd) {
  if (!enabled_) return;
  CASTOR_CHECK(!sd.empty(),
               "GradScaler::load_state_dict: the state dict is empty, possibly because it was saved "
               "from a disabled GradScaler");
  GradScalerOptions o = options_;
  o.growth_factor = get_f64(sd, "growth_factor");
  o.backoff_factor = get_f64(sd, "backoff_factor");
  o.growth_interval = static_cast<int64_t>(get_f64(sd, "growth_interval"));
  o.hysteresis = static_cast<int64_t>(get_f64(sd, "hysteresis"));
  o.min_scale = get_f64(sd, "min_scale");
  o.max_scale = get_f64(sd, "max_scale");
  o.init_scale = get_f64(sd, "scale");
  o.validate();
  options_ = o;
  state_.scale = static_cast<float>(o.init_scale);
  state_.growth_tracker = static_cast<int64_t>(get_f64(sd, "growth_tracker"));
  state_.hysteresis_left = static_cast<int64_t>(get_f64(sd, "hysteresis_left"));
  steps_taken_ = static_cast<int64_t>(get_f64(sd, "steps_taken"));
  steps_skipped_ = static_cast<int64_t>(get_f64(sd, "steps_skipped"));
  history_.push_back({updates_, state_.scale});
}

namespace {

// The total 2-norm of the step gradients of `params` in float64, over every rank's slices where an optimizer holding
// them is sharded (all-reduced, so every rank takes the same coefficient); scales each gradient by
// max_norm / (norm + 1e-6) when that is below 1.
double clip_step_grads(const std::vector<Tensor>& params, double max_norm) {
  CASTOR_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be > 0, got ", max_norm);
  const optim::NormParts parts = optim::step_grad_norm_parts(params);
  double total = 0;
  for (const Tensor& g : parts.parts)
    if (g.defined()) total += kernels::sum_of_squares(g);
  if (parts.group) {
    Tensor t = scalar_tensor(total, DType::Float64);
    parts.group->all_reduce(t);
    total = t.item();
  }
  total = std::sqrt(total);
  const double coef = clip_coefficient(total, max_norm);
  if (coef < 1) {
    NoGradGuard no_grad;
    for (const Tensor& g : parts.grads)
      if (g.defined()) Tensor(g).mul_(coef);
  }
  return total;
}

}  // namespace

double clip_grad_norm_(optim::Optimizer& optimizer, double max_norm) {
  std::vector<Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const auto& slot : group.slots) params.push_back(slot.param);
  return clip_step_grads(params, max_norm);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) { return clip_step_grads(params, max_norm); }

}  // namespace castor::amp
