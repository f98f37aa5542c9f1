// Optimizers with float32 master state (SGD, Adam, AdamW) and learning-rate schedulers.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "castor/random.h"
#include "castor/state_dict.h"
#include "castor/tensor.h"

namespace castor::optim {

// One parameter as the optimizer sees it. The math is float32 whatever the parameter's dtype:
//  - `master` is the float32 master weight: the parameter itself when it is float32, a float32 copy when
//    it is 16-bit and master weights are on (Apex O2), undefined when off (pure 16-bit, O3).
//  - `grad32` is a float32 gradient staged for the next step (by GradScaler::unscale_); when not staged,
//    step() reads param.grad() and widens it.
//  - `state` holds the moments (exp_avg, exp_avg_sq, momentum_buffer, ...), all float32.
struct ParamSlot {
  Tensor param;
  Tensor master;
  Tensor grad32;
  bool grad_staged = false;
  std::map<std::string, Tensor> state;
};

struct ParamGroup {
  std::vector<ParamSlot> slots;
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::string name;  // optional, for reports
};

// How the updated float32 value is written back into a 16-bit parameter.
enum class Rounding { Nearest, Stochastic };

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Applies one update to every parameter that has a gradient (staged or in .grad).
  void step();
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void add_param_group(const std::vector<Tensor>& params, double lr, double weight_decay);

  // Keeps float32 master copies of 16-bit parameters (Apex O2); off, 16-bit parameters are updated in
  // float32 and rounded back (nearest, or stochastic with `rounding`).
  void set_master_weights(bool on);
  bool master_weights() const { return master_weights_; }
  void set_rounding(Rounding r, uint64_t seed = 0);
  Generator& rounding_generator() { return rounding_gen_; }

  // Number of step() calls that updated parameters (not counting skipped ones), for schedulers' warning.
  int64_t step_count() const { return step_count_; }
  // Steps a GradScaler skipped (inf/NaN gradients), reported through note_skipped_step().
  int64_t skipped_steps() const { return skipped_steps_; }
  void note_skipped_step() { ++skipped_steps_; }

  // Every slot's state and master weight, and each group's hyper-parameters, as named tensors:
  // "state.<g>.<i>.<name>", "master.<g>.<i>", "group.<g>.lr", ...
  virtual StateDict state_dict() const;
  virtual void load_state_dict(const StateDict& sd);

 protected:
  // The float32 update of one slot: `w` is the float32 weight to update in place, `g` its float32 gradient.
  virtual void update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) = 0;
  std::vector<ParamGroup> groups_;
  bool master_weights_ = false;
  Rounding rounding_ = Rounding::Nearest;
  Generator rounding_gen_;
  int64_t step_count_ = 0;
  int64_t skipped_steps_ = 0;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  void validate() const;  // throws castor::Error naming the bad option
};
class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  const SGDOptions& options() const { return options_; }

 protected:
  void update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) override;

 private:
  SGDOptions options_;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false;
  bool decoupled_weight_decay = false;  // true: AdamW
  void validate() const;
};
class Adam : public Optimizer {
 public:
  Adam(const std::vector<Tensor>& params, AdamOptions options);
  const AdamOptions& options() const { return options_; }

 protected:
  void update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) override;

 private:
  AdamOptions options_;
};
// AdamW: Adam with decoupled weight decay (default weight_decay 1e-2, as PyTorch).
std::unique_ptr<Adam> make_adamw(const std::vector<Tensor>& params, AdamOptions options);

}  // namespace castor::optim
