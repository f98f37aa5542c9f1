// amp::initialize: the opt-level table, model casting, optimizer setup, per-loss scalers and the precision state.
#include "castor/amp.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>

#include "castor/backends.h"

namespace castor::amp {

namespace {

// The models of the Amp objects alive now (amp::initialize refuses them a second time).
std::mutex g_live_mutex;
std::set<const nn::Module*> g_live_models;

const char* bool_str(bool b) { return b ? "true" : "false"; }

GradScalerOptions scaler_options(const Properties& p) {
  GradScalerOptions o;
  o.dtype = p.dtype;
  o.min_scale = p.min_loss_scale;
  o.max_scale = p.max_loss_scale;
  o.init_scale = std::min(o.init_scale, o.max_scale);  // as Apex: the scale starts at min(2^16, max_loss_scale)
  if (p.level == OptLevel::O0) {
    o.enabled = false;
  } else if (!p.loss_scale.is_dynamic()) {
    o.enabled = true;
    o.dynamic = false;
    o.init_scale = *p.loss_scale.value;
  } else {
    // Dynamic scaling for float16 only (bfloat16 gradients do not underflow): the scaler's own default, chosen
    // here so that no notice is given for a choice the level made.
    o.enabled = p.dtype == DType::Float16;
  }
  return o;
}

const std::string& meta(const PrecisionState& s, const std::string& key) {
  auto it = s.metadata.find(key);
  CASTOR_CHECK(it != s.metadata.end(), "amp: the precision state lacks \"", key, "\" (not saved by Amp?)");
  return it->second;
}

// Names the parameters of model m as "<m>.<name>" when there are several models.
std::string model_prefix(size_t m, size_t count) { return count == 1 ? "" : std::to_string(m) + "."; }

// Apex's patched-forward cast: floating tensors to `dtype`; others (integer labels, indices) untouched.
Tensor cast_floating(const Tensor& t, DType dtype) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != dtype ? t.to(dtype) : Tensor();
}

// Makes the 16-bit parameter's micro-batch gradients add up in a float32 .grad: before each gradient reaches
// it, a missing or 16-bit .grad is replaced by a float32 one, so the engine accumulates in float32.
void accumulate_grad_in_fp32(const Tensor& param) {
  std::weak_ptr<TensorImpl> weak = param.impl_ptr();
  param.register_hook([weak](const Tensor&) {
    if (auto impl = weak.lock()) {
      const Tensor p(impl);
      const Tensor g = p.grad();
      if (!g.defined())
        p.set_grad(zeros(p.shape(), DType::Float32));
      else if (g.dtype() != DType::Float32)
        p.set_grad(g.to(DType::Float32));
    }
    return Tensor();
  });
}

// Entries of `sd` under "<prefix>", with the prefix removed.
StateDict sub_dict(const StateDict& sd, const std::string& prefix) {
  StateDict out;
  for (auto it = sd.lower_bound(prefix); it != sd.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out[it->first.substr(prefix.size())] = it->second;
  return out;
}

}  // namespace

OptLevel parse_opt_level(const std::string& s) {
  for (OptLevel l : {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3})
    if (s == opt_level_name(l)) return l;
  CASTOR_CHECK(false, "amp: unknown opt level \"", s, "\" (expected O0, O1, O2 or O3)");
  return OptLevel::O0;
}

AutoPrecision auto_precision() {
  if (const char* units = backends::bf16_dot_units())
    return {OptLevel::O1, DType::BFloat16, detail::cat("auto: ", units)};
  return {OptLevel::O0, DType::BFloat16, "auto: no bf16 units on this CPU; --precision bf16-mixed to force it"};
}

const char* opt_level_name(OptLevel level) {
  switch (level) {
    case OptLevel::O0: return "O0";
    case OptLevel::O1: return "O1";
    case OptLevel::O2: return "O2";
    case OptLevel::O3: return "O3";
  }
  return "?";
}

std::string to_string(const LossScale& s) {
  if (s.is_dynamic()) return "dynamic";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), *s.value);  // the shortest spelling that reads back the same
  return std::string(buf, r.ptr);
}

Properties properties_for(OptLevel level, DType dtype, const Overrides& ov) {
  CASTOR_CHECK(is_16bit_float(dtype), "amp: the 16-bit type must be float16 or bfloat16, got ", dtype_name(dtype));
  Properties p;
  p.level = level;
  p.dtype = dtype;
  switch (level) {
    case OptLevel::O0: p.loss_scale = 1.0; break;
    case OptLevel::O1: p.autocast = true; break;
    case OptLevel::O2:
      p.cast_model_type = dtype;
      p.keep_batchnorm_fp32 = true;
      p.master_weights = true;
      break;
    case OptLevel::O3:
      p.cast_model_type = dtype;
      p.loss_scale = 1.0;
      break;
  }
  if (ov.cast_model_type) p.cast_model_type = *ov.cast_model_type;
  if (ov.keep_batchnorm_fp32) p.keep_batchnorm_fp32 = *ov.keep_batchnorm_fp32;
  if (ov.master_weights) p.master_weights = *ov.master_weights;
  if (ov.loss_scale) p.loss_scale = *ov.loss_scale;
  if (ov.min_loss_scale) p.min_loss_scale = *ov.min_loss_scale;
  if (ov.max_loss_scale) p.max_loss_scale = *ov.max_loss_scale;
  if (ov.rounding) p.rounding = *ov.rounding;
  p.rounding_seed = ov.rounding_seed;
  if (ov.fp32_grad_accumulation) p.fp32_grad_accumulation = *ov.fp32_grad_accumulation;
  if (p.cast_model_type) p.cast_model_outputs = ov.cast_model_outputs.value_or(DType::Float32);
  CASTOR_CHECK(!ov.cast_model_outputs || p.cast_model_type, "amp: cast_model_outputs needs cast_model_type");
  CASTOR_CHECK(!p.cast_model_type || *p.cast_model_type == DType::Float32 || *p.cast_model_type == dtype,
               "amp: cast_model_type must be float32 or ", dtype_name(dtype), ", got ", dtype_name(*p.cast_model_type));
  CASTOR_CHECK(!p.keep_batchnorm_fp32 || p.cast_model_type, "amp: keep_batchnorm_fp32 needs cast_model_type");
  CASTOR_CHECK(p.loss_scale.is_dynamic() || (std::isfinite(*p.loss_scale.value) && *p.loss_scale.value > 0),
               "amp: loss_scale must be dynamic or a positive number, got ", to_string(p.loss_scale));
  scaler_options(p).validate();
  return p;
}

Amp::Amp(std::vector<nn::Module*> models, std::vector<optim::Optimizer*> optimizers, Properties properties,
         int num_losses)
    : models_(std::move(models)), optimizers_(std::move(optimizers)), props_(std::move(properties)) {
  CASTOR_CHECK(num_losses >= 1, "amp: num_losses must be >= 1, got ", num_losses);
  CASTOR_CHECK(!models_.empty(), "amp: no model");
  for (nn::Module* m : models_) CASTOR_CHECK(m != nullptr, "amp: a null model");
  for (optim::Optimizer* o : optimizers_) CASTOR_CHECK(o != nullptr, "amp: a null optimizer");
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t m = 0; m < models_.size(); ++m)
    for (auto& [name, p] : models_[m]->named_parameters())
      named.emplace_back(model_prefix(m, models_.size()) + name, p);
  for (int k = 0; k < num_losses; ++k) scalers_.push_back(std::make_unique<GradScaler>(scaler_options(props_), named));
  for (optim::Optimizer* o : optimizers_) o->set_step_interceptor(this);
  std::lock_guard<std::mutex> lock(g_live_mutex);
  for (nn::Module* m : models_) g_live_models.insert(m);
}

Amp::~Amp() {
  optim::release_step_interceptor(this);
  std::lock_guard<std::mutex> lock(g_live_mutex);
  for (nn::Module* m : models_) g_live_models.erase(m);
}

AutocastGuard disable_casts() { return AutocastGuard(DType::BFloat16, /*enabled=*/false); }

GradScaler& Amp::scaler(int loss_id) {
  CASTOR_CHECK(loss_id >= 0 && loss_id < num_losses(), "amp: loss_id ", loss_id, " out of range (", num_losses(),
               " losses)");
  return *scalers_[loss_id];
}

optim::Optimizer& Amp::bound_check(optim::Optimizer& optimizer, const char* what) {
  bool known = false;
  for (optim::Optimizer* o : optimizers_) known |= o == &optimizer;
  CASTOR_CHECK(known, "amp::", what, ": the optimizer was not passed to initialize()");
  return optimizer;
}

Tensor Amp::scale_loss(const Tensor& loss, optim::Optimizer& optimizer, int loss_id) {
  return scale_loss(loss, std::vector<optim::Optimizer*>{&optimizer}, loss_id);
}

Tensor Amp::scale_loss(const Tensor& loss, const std::vector<optim::Optimizer*>& optimizers, int loss_id) {
  GradScaler& s = scaler(loss_id);
  CASTOR_CHECK(!optimizers.empty(), "amp::scale_loss: no optimizer");
  for (optim::Optimizer* o : optimizers) {
    CASTOR_CHECK(o != nullptr, "amp::scale_loss: a null optimizer");
    bound_check(*o, "scale_loss");
    auto it = loss_of_.find(o);
    CASTOR_CHECK(it == loss_of_.end() || it->second == loss_id,
                 "amp::scale_loss: this optimizer holds gradients of loss ", it->second,
                 "; step it before backpropagating loss ", loss_id, " into it");
    CASTOR_CHECK(it == loss_of_.end() || !s.unscaled(*o),
                 "amp::scale_loss: the optimizer's gradients were already "
                 "unscaled (by unscale_, master_params or clip_grad_norm_); step it before another scaled backward");
  }
  for (optim::Optimizer* o : optimizers) loss_of_.emplace(o, loss_id);
  return s.scale(loss);
}

void Amp::unscale_(optim::Optimizer& optimizer) {
  CASTOR_CHECK(loss_of_.count(&bound_check(optimizer, "unscale_")),
               "amp::unscale_: no scale_loss() for this optimizer since its last step");
  prepare_gradients(optimizer);
}

double Amp::unscale_clip_(optim::Optimizer& optimizer, double max_norm) {
  auto it = loss_of_.find(&bound_check(optimizer, "unscale_clip_"));
  CASTOR_CHECK(it != loss_of_.end(), "amp::unscale_clip_: no scale_loss() for this optimizer since its last step");
  return scaler(it->second).unscale_clip_(optimizer, max_norm);
}

void Amp::prepare_gradients(optim::Optimizer& optimizer) {
  auto it = loss_of_.find(&optimizer);
  if (it == loss_of_.end()) return;  // no scaled backward since its last step: the gradients are as they are
  GradScaler& s = scaler(it->second);
  if (s.is_enabled() && !s.unscaled(optimizer)) s.unscale_(optimizer);
}

void Amp::intercept_step(optim::Optimizer& optimizer) {
  if (loss_of_.count(&optimizer))
    step(optimizer);
  else
    optimizer.apply_step();  // no scale_loss since the last step: the gradients are not scaled
}

bool Amp::step(optim::Optimizer& optimizer) {
  auto it = loss_of_.find(&bound_check(optimizer, "step"));
  CASTOR_CHECK(it != loss_of_.end(), "amp::step: no scale_loss() for this optimizer since its last step");
  const int loss_id = it->second;
  // As Apex, the optimizers of one loss step or skip together: an overflow in any of their gradients (those still
  // to step are unscaled now; those stepped this iteration are remembered by the scaler) skips each.
  GradScaler& s = scaler(loss_id);
  bool overflow = false;
  for (optim::Optimizer* o : optimizers_) {
    auto pending = loss_of_.find(o);
    if (pending != loss_of_.end() && pending->second == loss_id) prepare_gradients(*o);
    overflow |= s.found_inf(*o);
  }
  const bool stepped = s.step(optimizer, /*skip_with_others=*/overflow);
  loss_of_.erase(it);
  bool others = false;  // optimizers still to step on this loss's scale this iteration
  for (auto& [opt, id] : loss_of_) others |= id == loss_id;
  if (!others) s.update();
  return stepped;
}

StateDict Amp::model_state_dict(size_t index) const {
  CASTOR_CHECK(index < models_.size(), "amp: model ", index, " out of range (", models_.size(), " models)");
  const nn::Module& model = *models_[index];
  StateDict sd = model.state_dict();
  std::map<const TensorImpl*, Tensor> masters;
  for (const optim::Optimizer* o : optimizers_)
    for (const auto& g : o->param_groups())
      for (const auto& slot : g.slots)
        if (slot.master.defined()) masters[slot.param.impl()] = o->whole_master(slot);  // (ZeRO: gathered)
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = masters.find(p.impl());
    if (it != masters.end()) sd[name] = it->second.detach();
  }
  return sd;
}

StateDict Amp::state_dict() const {
  StateDict sd;
  for (size_t k = 0; k < scalers_.size(); ++k) {
    const std::string prefix = "loss_scaler" + std::to_string(k) + ".";
    sd[prefix + "loss_scale"] = scalar_tensor(scalers_[k]->get_scale(), DType::Float32);
    sd[prefix + "unskipped"] = scalar_tensor(static_cast<double>(scalers_[k]->growth_tracker()), DType::Int64);
  }
  return sd;
}

void Amp::load_state_dict(const StateDict& sd) {
  for (const auto& [key, t] : sd) {
    const size_t dot = key.find('.');
    const std::string head = key.substr(0, dot), field = dot == std::string::npos ? "" : key.substr(dot + 1);
    bool known = false;
    for (size_t k = 0; k < scalers_.size(); ++k) known |= head == "loss_scaler" + std::to_string(k);
    CASTOR_CHECK(known && (field == "loss_scale" || field == "unskipped"), "amp::load_state_dict: unexpected key \"",
                 key, "\" (this run has ", scalers_.size(), " loss scalers)");
    CASTOR_CHECK(t.numel() == 1, "amp::load_state_dict: \"", key, "\" is ", t.describe(), ", expected one value");
  }
  std::vector<StateDict> updated;
  for (size_t k = 0; k < scalers_.size(); ++k) {
    const std::string prefix = "loss_scaler" + std::to_string(k) + ".";
    for (const char* f : {"loss_scale", "unskipped"})
      CASTOR_CHECK(sd.count(prefix + f), "amp::load_state_dict: missing key \"", prefix, f, "\"");
    const double scale = sd.at(prefix + "loss_scale").item(), unskipped = sd.at(prefix + "unskipped").item();
    CASTOR_CHECK(std::isfinite(scale) && scale > 0, "amp::load_state_dict: \"", prefix,
                 "loss_scale\" must be finite "
                 "and > 0, got ",
                 scale);
    CASTOR_CHECK(unskipped >= 0, "amp::load_state_dict: \"", prefix, "unskipped\" must be >= 0, got ", unskipped);
    StateDict full = scalers_[k]->state_dict();
    if (full.empty()) {  // a disabled scaler (O0) scales by 1
      CASTOR_CHECK(scale == 1.0, "amp::load_state_dict: \"", prefix, "loss_scale\" is ", scale,
                   " but this run does not scale its losses (", opt_level_name(props_.level), ")");
    } else {
      full["scale"] = scalar_tensor(scale, DType::Float32);
      full["growth_tracker"] = scalar_tensor(unskipped, DType::Int64);
    }
    updated.push_back(std::move(full));
  }
  for (size_t k = 0; k < scalers_.size(); ++k)
    if (!updated[k].empty()) scalers_[k]->load_state_dict(updated[k]);
}

std::string Amp::param_signature() const {
  std::string sig;
  for (size_t m = 0; m < models_.size(); ++m)
    for (const auto& [name, p] : models_[m]->named_parameters())
      sig += model_prefix(m, models_.size()) + name + ":" + dtype_name(p.dtype()) + shape_str(p.shape()) + ";";
  return sig;
}

PrecisionState Amp::precision_state(bool copies, std::map<std::string, optim::Optimizer::SliceOf>* slices) const {
  PrecisionState st;
  for (size_t k = 0; k < scalers_.size(); ++k)
    for (auto& [key, t] : scalers_[k]->state_dict()) st.tensors["scaler." + std::to_string(k) + "." + key] = t;
  for (size_t j = 0; j < optimizers_.size(); ++j) {
    const std::string prefix = "optimizer." + std::to_string(j) + ".";
    std::map<std::string, optim::Optimizer::SliceOf> where;
    for (auto& [key, t] : slices ? optimizers_[j]->state_dict_slices(where) : optimizers_[j]->state_dict(copies))
      st.tensors[prefix + key] = t;
    for (auto& [key, w] : where) (*slices)[prefix + key] = w;
  }
  const Properties& p = props_;
  st.metadata = {{"format", "castor.amp.precision_state"},
                 {"version", std::to_string(PrecisionState::kVersion)},
                 {"opt_level", opt_level_name(p.level)},
                 {"dtype", dtype_name(p.dtype)},
                 {"autocast", bool_str(p.autocast)},
                 {"cast_model_type", p.cast_model_type ? dtype_name(*p.cast_model_type) : "none"},
                 {"keep_batchnorm_fp32", bool_str(p.keep_batchnorm_fp32)},
                 {"master_weights", bool_str(p.master_weights)},
                 {"loss_scale", to_string(p.loss_scale)},
                 {"rounding", p.rounding == optim::Rounding::Stochastic ? "stochastic" : "nearest"},
                 {"num_losses", std::to_string(scalers_.size())},
                 {"num_optimizers", std::to_string(optimizers_.size())},
                 {"parameters", param_signature()}};
  return st;
}

void Amp::load_precision_state(const PrecisionState& st) {
  const std::string& version = meta(st, "version");
  CASTOR_CHECK(version == std::to_string(PrecisionState::kVersion), "amp: precision state version ", version,
               " is not supported (this build reads version ", PrecisionState::kVersion, ")");
  CASTOR_CHECK(meta(st, "opt_level") == opt_level_name(props_.level), "amp: the checkpoint was saved at opt level ",
               meta(st, "opt_level"), ", this run is ", opt_level_name(props_.level));
  CASTOR_CHECK(meta(st, "dtype") == dtype_name(props_.dtype), "amp: the checkpoint was saved with ", meta(st, "dtype"),
               ", this run uses ", dtype_name(props_.dtype));
  CASTOR_CHECK(meta(st, "num_losses") == std::to_string(scalers_.size()) &&
                   meta(st, "num_optimizers") == std::to_string(optimizers_.size()),
               "amp: the checkpoint has ", meta(st, "num_losses"), " losses and ", meta(st, "num_optimizers"),
               " optimizers, this run ", scalers_.size(), " and ", optimizers_.size());
  const std::string& saved = meta(st, "parameters");
  const std::string mine = param_signature();
  if (saved != mine) {
    size_t i = 0;
    while (i < saved.size() && i < mine.size() && saved[i] == mine[i]) ++i;
    const size_t from = saved.rfind(';', i == 0 ? 0 : i - 1);
    const size_t start = from == std::string::npos ? 0 : from + 1;
    CASTOR_CHECK(false, "amp: the checkpoint's parameters differ from the model's: saved \"",
                 saved.substr(start, saved.find(';', start) - start), "\" vs model \"",
                 mine.substr(start, mine.find(';', start) - start), "\"");
  }
  for (size_t j = 0; j < optimizers_.size(); ++j)
    optimizers_[j]->load_state_dict(sub_dict(st.tensors, "optimizer." + std::to_string(j) + "."));
  for (size_t k = 0; k < scalers_.size(); ++k)
    scalers_[k]->load_state_dict(sub_dict(st.tensors, "scaler." + std::to_string(k) + "."));
  loss_of_.clear();
}

void cast_parameters(nn::Module& module, const Properties& p) {
  if (p.cast_model_type) {
    module.to(*p.cast_model_type, p.keep_batchnorm_fp32);
  } else if (p.autocast) {
    // A frozen parameter (a LoRA base) is stored once in the 16-bit type rather than kept in float32 and cast by
    // every forward; norm layers keep theirs in float32, as their ops compute in float32.
    module.to(p.dtype, /*keep_norms_fp32=*/true, /*frozen_only=*/true);
  }
}

std::unique_ptr<Amp> initialize(const std::vector<nn::Module*>& models,
                                const std::vector<optim::Optimizer*>& optimizers, OptLevel level, DType dtype,
                                const Overrides& overrides, int num_losses) {
  // As Apex, once per model and optimizer: a second call would cast, hook and wrap them again.
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    for (nn::Module* model : models)
      CASTOR_CHECK(!g_live_models.count(model),
                   "amp::initialize: the model was already initialized (call it once "
                   "per model and optimizer, and use the Amp it returned)");
  }
  for (optim::Optimizer* o : optimizers)
    CASTOR_CHECK(o == nullptr || o->step_interceptor() == nullptr,
                 "amp::initialize: the optimizer was already "
                 "initialized (call it once per model and optimizer, and use the Amp it returned)");
  Properties p = properties_for(level, dtype, overrides);
  for (nn::Module* model : models) {
    CASTOR_CHECK(model != nullptr, "amp::initialize: a null model");
    cast_parameters(*model, p);
    if (p.cast_model_type) {
      model->register_forward_pre_hook([to = *p.cast_model_type](const Tensor& x) { return cast_floating(x, to); });
      model->register_forward_hook([to = *p.cast_model_outputs](const Tensor& y) { return cast_floating(y, to); });
    }
    if (p.fp32_grad_accumulation)
      for (const Tensor& param : model->parameters())
        if (is_16bit_float(param.dtype())) accumulate_grad_in_fp32(param);
  }
  for (optim::Optimizer* o : optimizers) {
    CASTOR_CHECK(o != nullptr, "amp::initialize: a null optimizer");
    o->set_master_weights(p.master_weights);
    o->set_rounding(p.rounding, p.rounding_seed);
  }
  return std::make_unique<Amp>(models, optimizers, std::move(p), num_losses);
}

std::unique_ptr<Amp> initialize(nn::Module& model, const std::vector<optim::Optimizer*>& optimizers, OptLevel level,
                                DType dtype, const Overrides& overrides, int num_losses) {
  return initialize(std::vector<nn::Module*>{&model}, optimizers, level, dtype, overrides, num_losses);
}

std::vector<Tensor> master_params(optim::Optimizer& optimizer) {
  if (optim::StepInterceptor* i = optimizer.step_interceptor()) i->prepare_gradients(optimizer);
  std::vector<Tensor> out;
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].slots.size(); ++i) {
      optim::ParamSlot& slot = groups[g].slots[i];
      if (!slot.master.defined()) {
        out.push_back(slot.param);
        continue;
      }
      if (!slot.staged_grad().defined() && slot.param.grad().defined()) {  // a float32 copy, so edits reach the step
        Tensor grad = slot.param.grad().detach();
        if (optimizer.shard_group())  // (ZeRO: the master is this rank's slice)
          grad = grad.contiguous().view({-1}).narrow(0, slot.shard.begin, slot.shard.length);
        optimizer.stage_float32_grad(g, i, grad.to(DType::Float32).contiguous());
      }
      slot.master.set_grad(slot.staged_grad());
      out.push_back(slot.master);
    }
  return out;
}

}  // namespace castor::amp
