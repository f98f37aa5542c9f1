// Apex-style opt levels O0-O3: amp::initialize, the training-loop helpers, and the versioned precision state.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/autocast.h"
#include "castor/grad_scaler.h"
#include "castor/nn.h"
#include "castor/optim.h"

namespace castor::amp {

enum class OptLevel { O0, O1, O2, O3 };
OptLevel parse_opt_level(const std::string& s);  // "O0".."O3"; raises naming the text otherwise
const char* opt_level_name(OptLevel level);

// What an opt level does; each field can be overridden.
struct Properties {
  OptLevel level = OptLevel::O1;
  DType dtype = DType::Float16;          // the 16-bit type: float16 or bfloat16
  bool autocast = false;                 // forward() applies autocast (O1)
  std::optional<DType> cast_model_type;  // the model is cast to this (O2, O3), or stays as it is
  bool keep_batchnorm_fp32 = false;      // with cast_model_type: BatchNorm layers stay float32
  bool master_weights = false;           // the optimizers keep float32 masters of 16-bit parameters
  std::string loss_scale = "dynamic";    // "dynamic" or a number (a static scale)
  double min_loss_scale = 1.1754943508222875e-38;
  double max_loss_scale = 16777216.0;    // Apex's 2^24
  optim::Rounding rounding = optim::Rounding::Nearest;  // write-back into 16-bit parameters
  uint64_t rounding_seed = 0;
};

struct Overrides {
  std::optional<DType> cast_model_type = {};
  std::optional<bool> keep_batchnorm_fp32 = {}, master_weights = {};
  std::optional<std::string> loss_scale = {};
  std::optional<double> min_loss_scale = {}, max_loss_scale = {};
  std::optional<optim::Rounding> rounding = {};
  uint64_t rounding_seed = 0;
};

// The level's defaults (Apex's table) with the overrides applied; raises on an inconsistent combination.
Properties properties_for(OptLevel level, DType dtype = DType::Float16, const Overrides& overrides = {});

// Scoped autocast for a forward pass (a no-op unless the level autocasts).
class ForwardScope {
 public:
  ForwardScope(bool enabled, DType dtype) : guard_(dtype, enabled) {}

 private:
  AutocastGuard guard_;
};

// The precision state of a run, saved beside the model: named tensors and string metadata (with a version).
struct PrecisionState {
  static constexpr int kVersion = 1;
  StateDict tensors;
  std::map<std::string, std::string> metadata;
};

// The result of initialize(): holds the properties, the model and optimizers (not owned), and one GradScaler
// per loss. The Apex loop translates as
//   auto amp = amp::initialize(model, {&opt}, amp::OptLevel::O1);
//   { auto fw = amp->forward(); loss = loss_fn(model(x), y); }
// (at O2/O3 the input goes in as properties().cast_model_type and the output is widened to float32 for the
// loss, as Apex's patched forward does)
//   amp->scale_loss(loss, opt).backward();
//   amp->step(opt); opt.zero_grad();
class Amp {
 public:
  Amp(nn::Module& model, std::vector<optim::Optimizer*> optimizers, Properties properties, int num_losses);

  const Properties& properties() const { return props_; }
  ForwardScope forward() const { return ForwardScope(props_.autocast, props_.dtype); }

  // The loss multiplied by loss `loss_id`'s scale; `optimizer` will be unscaled and stepped with that scaler.
  // An optimizer collects gradients for one loss_id between steps.
  Tensor scale_loss(const Tensor& loss, optim::Optimizer& optimizer, int loss_id = 0);
  // Unscales the optimizer's gradients into float32 now (before clipping); step() then does not again.
  void unscale_(optim::Optimizer& optimizer);
  // Steps the optimizer unless its gradients overflowed, then updates that loss's scale. Returns whether it
  // stepped.
  bool step(optim::Optimizer& optimizer);

  GradScaler& scaler(int loss_id = 0);
  int num_losses() const { return static_cast<int>(scalers_.size()); }

  // The model's state with every 16-bit parameter replaced by its float32 master weight where there is one.
  StateDict model_state_dict() const;

  // Level, properties, each scaler's state, each optimizer's state (master weights, moments, rounding RNG),
  // and a signature of the parameter set. load_precision_state checks version, level, dtype and parameters
  // before changing anything.
  PrecisionState precision_state() const;
  void load_precision_state(const PrecisionState& state);

 private:
  optim::Optimizer& bound_check(optim::Optimizer& optimizer, const char* what);
  std::string param_signature() const;

  nn::Module& model_;
  std::vector<optim::Optimizer*> optimizers_;
  Properties props_;
  std::vector<std::unique_ptr<GradScaler>> scalers_;
  std::map<const optim::Optimizer*, int> loss_of_;  // the loss_id each optimizer collects gradients for
};

// Casts the model and configures the optimizers for the level (model first: optimizers made on its float32
// parameters see the cast, as they share the parameter tensors), and returns the loop helper.
std::unique_ptr<Amp> initialize(nn::Module& model, const std::vector<optim::Optimizer*>& optimizers,
                                OptLevel level, DType dtype = DType::Float16, const Overrides& overrides = {},
                                int num_losses = 1);

}  // namespace castor::amp
