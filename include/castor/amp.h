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
#include "castor/opt_level.h"
#include "castor/optim.h"

namespace castor::amp {

// A loss scale as Apex's loss_scale argument takes it: "dynamic" (GradScaler's growth and backoff) or a static
// positive number (`LossScale(128.0)`).
struct LossScale {
  LossScale() = default;                     // dynamic
  LossScale(double value) : value(value) {}  // NOLINT(google-explicit-constructor): Apex's loss_scale=128.0
  static LossScale dynamic() { return {}; }
  bool is_dynamic() const { return !value.has_value(); }
  std::optional<double> value;  // the static scale; nullopt: dynamic
};
// "dynamic", or the static scale as a number ("128").
std::string to_string(const LossScale& s);

// What an opt level does; each field can be overridden.
struct Properties {
  OptLevel level = OptLevel::O1;
  DType dtype = DType::Float16;          // the 16-bit type: float16 or bfloat16
  bool autocast = false;                 // forward() applies autocast (O1); initialize() then stores frozen
                                         // parameters (requires_grad false, outside norm layers) in the 16-bit type
  std::optional<DType> cast_model_type;  // the model is cast to this (O2, O3), or stays as it is
  bool keep_batchnorm_fp32 = false;      // with cast_model_type: BatchNorm layers stay float32
  // With cast_model_type, the models' forward casts floating inputs to it and floating outputs to this (as
  // Apex's patched forward: float32 unless overridden); integer inputs pass untouched.
  std::optional<DType> cast_model_outputs;
  bool master_weights = false;  // the optimizers keep float32 masters of 16-bit parameters
  LossScale loss_scale;         // dynamic, or a static scale
  double min_loss_scale = 1.1754943508222875e-38;
  double max_loss_scale = 16777216.0;                   // Apex's 2^24
  optim::Rounding rounding = optim::Rounding::Nearest;  // write-back into 16-bit parameters
  uint64_t rounding_seed = 0;
  // 16-bit parameters sum their micro-batch gradients in float32 .grad buffers, never in 16-bit (DeepSpeed's
  // fp32 gradient accumulation for bfloat16).
  bool fp32_grad_accumulation = false;
};

struct Overrides {
  std::optional<DType> cast_model_type = {}, cast_model_outputs = {};
  std::optional<bool> keep_batchnorm_fp32 = {}, master_weights = {};
  std::optional<LossScale> loss_scale = {};
  std::optional<double> min_loss_scale = {}, max_loss_scale = {};
  std::optional<optim::Rounding> rounding = {};
  uint64_t rounding_seed = 0;
  std::optional<bool> fp32_grad_accumulation = {};
};

// The level's defaults (Apex's table) with the overrides applied; raises on an inconsistent combination.
Properties properties_for(OptLevel level, DType dtype = DType::Float16, const Overrides& overrides = {});
// The parameter dtypes initialize() gives a model under `p`, applied to `module` in place: cast_model_type (O2, O3)
// casts every floating parameter and buffer but the norm layers' with keep_batchnorm_fp32; autocast (O1) stores the
// frozen parameters in the 16-bit type. For a part of a model cast ahead of initialize() (ZeRO-3's sharded
// construction casts each block before keeping its slice), which then leaves it as it is.
void cast_parameters(nn::Module& module, const Properties& p);

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

// Apex's `with amp.disable_casts():` - autocast off while the returned guard lives.
AutocastGuard disable_casts();

// The result of initialize(): holds the properties, the models and optimizers (not owned; they must stay alive
// while it is used), and one GradScaler per loss. It patches each optimizer's step() as Apex does, so the Apex loop
// translates line by line:
//   auto amp = amp::initialize(model, {&opt}, amp::OptLevel::O1);
//   { auto fw = amp->forward(); loss = loss_fn(model(x), y); }   // O2/O3: model(x) casts x and the output
//   amp->scale_loss(loss, opt).backward();
//   opt.step(); opt.zero_grad();                                 // = amp->step(opt): unscale, skip on inf/NaN
class Amp : public optim::StepInterceptor {
 public:
  Amp(std::vector<nn::Module*> models, std::vector<optim::Optimizer*> optimizers, Properties properties,
      int num_losses);
  ~Amp() override;
  Amp(const Amp&) = delete;
  Amp& operator=(const Amp&) = delete;

  const Properties& properties() const { return props_; }
  ForwardScope forward() const { return ForwardScope(props_.autocast, props_.dtype); }

  // The loss multiplied by loss `loss_id`'s scale; `optimizer` will be unscaled and stepped with that scaler.
  // An optimizer collects gradients for one loss_id between steps.
  Tensor scale_loss(const Tensor& loss, optim::Optimizer& optimizer, int loss_id = 0);
  // Apex's scale_loss(loss, [opt1, opt2]): each optimizer is stepped with this loss's scaler.
  Tensor scale_loss(const Tensor& loss, const std::vector<optim::Optimizer*>& optimizers, int loss_id = 0);
  // Unscales the optimizer's gradients into float32 now (before clipping), once: step() and later calls do
  // not again.
  void unscale_(optim::Optimizer& optimizer);
  // unscale_ and clip_grad_norm_(optimizer, max_norm) folded into the optimizer's next step (max_norm 0: no
  // clipping): GradScaler::unscale_clip_ with this optimizer's loss's scaler; returns the total norm (0 unclipped).
  double unscale_clip_(optim::Optimizer& optimizer, double max_norm);
  // Steps the optimizer unless a gradient of this loss's optimizers overflowed (Apex: they skip together), then
  // updates that loss's scale once every optimizer of the loss has stepped. Returns whether it stepped.
  // optimizer.step() does the same after scale_loss.
  bool step(optim::Optimizer& optimizer);

  GradScaler& scaler(int loss_id = 0);
  int num_losses() const { return static_cast<int>(scalers_.size()); }

  // Model `index`'s state with every 16-bit parameter replaced by its float32 master weight where there is one.
  StateDict model_state_dict(size_t index = 0) const;

  // Apex's amp.state_dict(): "loss_scaler<k>.loss_scale" (float32) and "loss_scaler<k>.unskipped" (int64, the
  // clean steps since the last overflow or growth) for each loss k. load_state_dict checks every key first.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  // Level, properties, each scaler's state, each optimizer's state (master weights, moments, rounding RNG),
  // and a signature of the parameter set (copies false: the optimizers' state as aliases, Optimizer::state_dict's).
  // load_precision_state checks version, level, dtype and parameters before changing anything.
  // With `slices` (ZeRO checkpoints): each sharded optimizer's tensors as this rank's slices, and where they lie
  // under their keys here ("optimizer.<j>.<key>"; Optimizer::state_dict_slices).
  PrecisionState precision_state(bool copies = true,
                                 std::map<std::string, optim::Optimizer::SliceOf>* slices = nullptr) const;
  void load_precision_state(const PrecisionState& state);

 private:
  // StepInterceptor: opt.step() after scale_loss goes through step(); gradients are unscaled before they are
  // read (master_params, clip_grad_norm_).
  void intercept_step(optim::Optimizer& optimizer) override;
  void prepare_gradients(optim::Optimizer& optimizer) override;

  optim::Optimizer& bound_check(optim::Optimizer& optimizer, const char* what);
  std::string param_signature() const;

  std::vector<nn::Module*> models_;
  std::vector<optim::Optimizer*> optimizers_;
  Properties props_;
  std::vector<std::unique_ptr<GradScaler>> scalers_;
  std::map<const optim::Optimizer*, int> loss_of_;  // the loss_id each optimizer collects gradients for
};

// Casts the models and configures the optimizers for the level (models first: optimizers made on their
// float32 parameters see the cast, as they share the parameter tensors), patches the models' forward with the
// O2/O3 input and output casts and the optimizers' step, and returns the loop helper.
std::unique_ptr<Amp> initialize(const std::vector<nn::Module*>& models,
                                const std::vector<optim::Optimizer*>& optimizers, OptLevel level,
                                DType dtype = DType::Float16, const Overrides& overrides = {}, int num_losses = 1);
std::unique_ptr<Amp> initialize(nn::Module& model, const std::vector<optim::Optimizer*>& optimizers, OptLevel level,
                                DType dtype = DType::Float16, const Overrides& overrides = {}, int num_losses = 1);

// Apex's amp.master_params(optimizer): the tensors the optimizer updates in float32 - each 16-bit parameter's
// float32 master weight where it has one, else the parameter. Their gradients are unscaled first (once) when
// scale_loss was called, and a master's .grad() is the float32 gradient the step will use, so
// clip_grad_norm_(master_params(opt), max) clips what the step uses. On a sharded optimizer (ZeRO) each master is
// this rank's slice, flattened, its .grad the slice of the gradient; clip_grad_norm_ adds every rank's slices.
std::vector<Tensor> master_params(optim::Optimizer& optimizer);

}  // namespace castor::amp
