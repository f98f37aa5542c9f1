// Learning-rate schedulers: PyTorch 1.13's chainable get_lr formulas (bit for bit), the call-order warning, state dicts.
#include "castor/lr_scheduler.h"

#include <cmath>
#include "castor/log.h"
#include <string>

#include "core/rounded_mul.h"

namespace castor::optim {

LRScheduler::LRScheduler(Optimizer& optimizer)
    : optimizer_(optimizer), optimizer_steps_at_start_(optimizer.step_count() + optimizer.skipped_steps()) {}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer_.param_groups()) lrs.push_back(g.lr);
  return lrs;
}

void LRScheduler::initial_step(std::vector<double> base_lrs) {
  base_lrs_ = base_lrs.empty() ? group_lrs() : std::move(base_lrs);
  step();
}

void LRScheduler::step() {
  ++last_epoch_;
  std::vector<double> lrs;
  try {
    lrs = get_lr();
  } catch (...) {
    --last_epoch_;
    throw;
  }
  // step 0 is taken by the constructor, so step_count_ == 1 here means the user's first call.
  if (step_count_ == 1 && optimizer_.step_count() + optimizer_.skipped_steps() - optimizer_steps_at_start_ < 1)
    warn(
        "lr_scheduler.step() was called before optimizer.step(), so the schedule's first learning rate is "
        "skipped; step the optimizer first, then the scheduler (as PyTorch 1.1+ expects)");
  ++step_count_;
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = lrs[g];
  last_lr_ = lrs;
}

StateDict LRScheduler::state_dict() const {
  StateDict sd;
  sd["last_epoch"] = scalar_tensor(static_cast<double>(last_epoch_), DType::Int64);
  sd["step_count"] = scalar_tensor(static_cast<double>(step_count_), DType::Int64);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    sd["base_lr." + std::to_string(g)] = scalar_tensor(base_lrs_[g], DType::Float64);
    sd["last_lr." + std::to_string(g)] = scalar_tensor(last_lr_[g], DType::Float64);
  }
  return sd;
}

void LRScheduler::load_state_dict(const StateDict& sd) {
  auto get = [&](const std::string& key, DType dtype) {
    auto it = sd.find(key);
    CASTOR_CHECK(it != sd.end(), "LRScheduler::load_state_dict: missing key \"", key, "\"");
    const Tensor& t = it->second;
    CASTOR_CHECK(t.defined() && t.dtype() == dtype && t.dim() == 0, "LRScheduler::load_state_dict: \"", key, "\" is ",
                 t.defined() ? t.describe() : "undefined", ", expected a ", dtype_name(dtype), " scalar");
    return t.item();
  };
  CASTOR_CHECK(sd.size() == 2 + 2 * base_lrs_.size(), "LRScheduler::load_state_dict: ", sd.size(),
               " entries, expected ", 2 + 2 * base_lrs_.size(), " for ", base_lrs_.size(), " parameter groups");
  const int64_t last_epoch = static_cast<int64_t>(get("last_epoch", DType::Int64));
  const int64_t step_count = static_cast<int64_t>(get("step_count", DType::Int64));
  std::vector<double> base(base_lrs_.size()), last(base_lrs_.size());
  for (size_t g = 0; g < base.size(); ++g) {
    base[g] = get("base_lr." + std::to_string(g), DType::Float64);
    last[g] = get("last_lr." + std::to_string(g), DType::Float64);
  }
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = base;
  last_lr_ = last;
}

// ---- StepLR ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  CASTOR_CHECK(step_size >= 1, "StepLR: step_size must be >= 1, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

// ---- CosineAnnealingLR ----

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  CASTOR_CHECK(t_max >= 1, "CosineAnnealingLR: t_max must be >= 1, got ", t_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) return lrs;
  const int64_t period = 2 * t_max_;
  const int64_t phase = ((last_epoch_ - 1 - t_max_) % period + period) % period;  // Python's modulo
  for (size_t g = 0; g < lrs.size(); ++g) {
    if (phase == 0)
      lrs[g] = lrs[g] + (base_lrs_[g] - eta_min_) * (1 - std::cos(M_PI / t_max_)) / 2;
    else
      lrs[g] = rounded_mul((1 + std::cos(M_PI * last_epoch_ / t_max_)) /
                               (1 + std::cos(M_PI * (last_epoch_ - 1) / t_max_)),
                           lrs[g] - eta_min_) +
               eta_min_;
  }
  return lrs;
}

// ---- WarmupCosineLR ----

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t decay_steps, double min_lr)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), decay_steps_(decay_steps), min_lr_(min_lr) {
  CASTOR_CHECK(warmup_steps >= 0 && decay_steps >= 1, "WarmupCosineLR: warmup_steps ", warmup_steps,
               " must be >= 0 and decay_steps ", decay_steps, " >= 1");
  CASTOR_CHECK(min_lr >= 0, "WarmupCosineLR: min_lr must be >= 0, got ", min_lr);
  initial_step();
}

std::vector<double> WarmupCosineLR::get_lr() const {
  std::vector<double> lrs(base_lrs_.size());
  const double it = static_cast<double>(last_epoch_);
  for (size_t g = 0; g < lrs.size(); ++g) {
    const double lr = base_lrs_[g], min_lr = base_lrs_[0] > 0 ? min_lr_ * lr / base_lrs_[0] : 0.0;
    if (last_epoch_ < warmup_steps_) {
      lrs[g] = lr * (it + 1) / static_cast<double>(warmup_steps_ + 1);
    } else if (last_epoch_ > decay_steps_ || decay_steps_ <= warmup_steps_) {
      lrs[g] = min_lr;
    } else {
      const double ratio = (it - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
      lrs[g] = min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
    }
  }
  return lrs;
}

// ---- OneCycleLR ----

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options) : LRScheduler(optimizer), options_(options) {
  const size_t groups = optimizer.param_groups().size();
  CASTOR_CHECK(options.total_steps > 0, "OneCycleLR: total_steps must be > 0, got ", options.total_steps);
  CASTOR_CHECK(options.pct_start >= 0 && options.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ",
               options.pct_start);
  CASTOR_CHECK(options.max_lr.size() == 1 || options.max_lr.size() == groups, "OneCycleLR: max_lr has ",
               options.max_lr.size(), " values for ", groups, " parameter groups");
  CASTOR_CHECK(options.div_factor > 0 && options.final_div_factor > 0,
               "OneCycleLR: div_factor and final_div_factor must be > 0");
  const double total = static_cast<double>(options.total_steps);
  if (options.three_phase)
    phases_ = {{options.pct_start * total - 1, Level::Initial, Level::Max},
               {2 * options.pct_start * total - 2, Level::Max, Level::Initial},
               {total - 1, Level::Initial, Level::Min}};
  else
    phases_ = {{options.pct_start * total - 1, Level::Initial, Level::Max}, {total - 1, Level::Max, Level::Min}};
  for (size_t g = 0; g < groups; ++g) {
    max_lr_.push_back(options.max_lr[options.max_lr.size() == 1 ? 0 : g]);
    initial_lr_.push_back(max_lr_.back() / options.div_factor);
    min_lr_.push_back(initial_lr_.back() / options.final_div_factor);
  }
  initial_step(initial_lr_);
}

double OneCycleLR::level(size_t group, Level l) const {
  switch (l) {
    case Level::Initial: return initial_lr_[group];
    case Level::Max: return max_lr_[group];
    case Level::Min: return min_lr_[group];
  }
  return 0;
}

std::vector<double> OneCycleLR::get_lr() const {
  CASTOR_CHECK(last_epoch_ <= options_.total_steps, "OneCycleLR: tried to step ", last_epoch_ + 1,
               " times; the specified number of total steps is ", options_.total_steps);
  std::vector<double> lrs(max_lr_.size());
  for (size_t g = 0; g < lrs.size(); ++g) {
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (last_epoch_ <= phase.end_step || i + 1 == phases_.size()) {
        CASTOR_CHECK(phase.end_step != start_step, "OneCycleLR: phase ", i, " is empty (pct_start ", options_.pct_start,
                     ", total_steps ", options_.total_steps, ")");
        const double pct = (last_epoch_ - start_step) / (phase.end_step - start_step);
        const double start = level(g, phase.start), end = level(g, phase.end);
        lrs[g] = options_.anneal == OneCycleLROptions::Anneal::Cos
                     ? end + rounded_mul((start - end) / 2.0, std::cos(M_PI * pct) + 1)
                     : rounded_mul(end - start, pct) + start;
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

// ---- LinearWarmup ----

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), start_factor_(start_factor) {
  CASTOR_CHECK(warmup_steps >= 1, "LinearWarmup: warmup_steps must be >= 1, got ", warmup_steps);
  CASTOR_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup: start_factor must be in (0, 1], got ",
               start_factor);
  initial_step();
}

std::vector<double> LinearWarmup::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr *= start_factor_;
  } else if (last_epoch_ <= warmup_steps_) {
    const double delta = 1.0 - start_factor_;
    for (double& lr : lrs)
      lr *= 1.0 + delta / (rounded_mul(static_cast<double>(warmup_steps_), start_factor_) +
                           rounded_mul(static_cast<double>(last_epoch_ - 1), delta));
  }
  return lrs;
}

}  // namespace castor::optim
