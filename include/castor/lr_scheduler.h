// Learning-rate schedulers (StepLR, CosineAnnealingLR, OneCycleLR, LinearWarmup) with PyTorch 1.13's formulas, and
// nanoGPT's warmup-cosine with PyTorch 1.13's formulas.
#pragma once
#include <cstdint>
#include <vector>

#include "castor/optim.h"
#include "castor/state_dict.h"

namespace castor::optim {

// Like torch.optim.lr_scheduler: construction takes step 0 (sets each group's lr to its first value);
// call step() after each optimizer.step().
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and sets every group's lr. If this is the first call and the optimizer has neither
  // stepped nor had a step skipped by a GradScaler since the scheduler was made, gives the
  // call-order warning through castor::warn (once).
  void step();
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }

  // "last_epoch", "step_count" (int64 0-dim), "base_lr.<g>", "last_lr.<g>" (float64 0-dim). The
  // hyper-parameters are the constructor's; the groups' lrs are restored by the optimizer's state dict.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);  // throws castor::Error naming a missing or malformed key

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Ends a derived constructor: records the base lrs (the groups' lrs when empty) and takes step 0.
  void initial_step(std::vector<double> base_lrs = {});
  // The lrs for last_epoch_, from the groups' current lrs and base_lrs_ (PyTorch's chainable get_lr).
  virtual std::vector<double> get_lr() const = 0;
  std::vector<double> group_lrs() const;

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;

 private:
  int64_t step_count_ = 0;
  int64_t optimizer_steps_at_start_ = 0;  // step_count() + skipped_steps() when constructed
  std::vector<double> last_lr_;
};

// lr *= gamma every step_size steps.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// Cosine annealing from the base lr to eta_min over t_max steps (and back up, periodically, past t_max).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);

 protected:
  std::vector<double> get_lr() const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

struct OneCycleLROptions {
  std::vector<double> max_lr;  // one for all groups, or one per group
  int64_t total_steps = 0;
  double pct_start = 0.3;
  enum class Anneal { Cos, Linear } anneal = Anneal::Cos;
  double div_factor = 25.0;       // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // min lr = initial lr / final_div_factor
  bool three_phase = false;
};
// The 1cycle policy (lr only: momentum is not cycled). Stepping past total_steps throws castor::Error.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);

 protected:
  std::vector<double> get_lr() const override;

 private:
  enum class Level { Initial, Max, Min };
  struct Phase {
    double end_step;
    Level start, end;
  };
  double level(size_t group, Level l) const;
  OneCycleLROptions options_;
  std::vector<Phase> phases_;
  std::vector<double> initial_lr_, max_lr_, min_lr_;
};

// Linear warmup from start_factor * lr to lr over warmup_steps steps, then constant (torch LinearLR with
// end_factor 1 and total_iters warmup_steps).
class LinearWarmup : public LRScheduler {
 public:
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor = 1.0 / 3);

 protected:
  std::vector<double> get_lr() const override;

 private:
  int64_t warmup_steps_;
  double start_factor_;
};

// nanoGPT's get_lr: lr * (step + 1) / (warmup_steps + 1) during warmup, then a cosine from lr down to min_lr at
// decay_steps, min_lr after (min_lr scales with each group's base lr: min_lr / lr of the first group).
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t decay_steps, double min_lr);

 protected:
  std::vector<double> get_lr() const override;

 private:
  int64_t warmup_steps_, decay_steps_;
  double min_lr_;
};

}  // namespace castor::optim
