// amp::initialize: the opt-level table, model casting, optimizer setup, per-loss scalers and the precision state.
#include "castor/amp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace castor::amp {

namespace {

const char* bool_str(bool b) { return b ? "true" : "false"; }

// "dynamic", or a positive finite number.
std::optional<double> static_scale(const std::string& loss_scale) {
  if (loss_scale == "dynamic") return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(loss_scale.c_str(), &end);
  CASTOR_CHECK(!loss_scale.empty() && *end == '\0' && std::isfinite(v) && v > 0,
               "amp: loss_scale must be \"dynamic\" or a positive number, got \"", loss_scale, "\"");
  return v;
}

GradScalerOptions scaler_options(const Properties& p) {
  GradScalerOptions o;
  o.dtype = p.dtype;
  o.min_scale = p.min_loss_scale;
  o.max_scale = p.max_loss_scale;
  o.init_scale = std::min(o.init_scale, o.max_scale);  // as Apex: the scale starts at min(2^16, max_loss_scale)
  if (p.level == OptLevel::O0) {
    o.enabled = false;
  } else if (auto s = static_scale(p.loss_scale)) {
    o.enabled = true;
    o.dynamic = false;
    o.init_scale = *s;
  }
  return o;
}

const std::string& meta(const PrecisionState& s, const std::string& key) {
  auto it = s.metadata.find(key);
  CASTOR_CHECK(it != s.metadata.end(), "amp: the precision state lacks \"", key, "\" (not saved by Amp?)");
  return it->second;
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

const char* opt_level_name(OptLevel level) {
  switch (level) {
    case OptLevel::O0: return "O0";
    case OptLevel::O1: return "O1";
    case OptLevel::O2: return "O2";
    case OptLevel::O3: return "O3";
  }
  return "?";
}

Properties properties_for(OptLevel level, DType dtype, const Overrides& ov) {
  CASTOR_CHECK(is_16bit_float(dtype), "amp: the 16-bit type must be float16 or bfloat16, got ", dtype_name(dtype));
  Properties p;
  p.level = level;
  p.dtype = dtype;
  switch (level) {
    case OptLevel::O0: p.loss_scale = "1.0"; break;
    case OptLevel::O1: p.autocast = true; break;
    case OptLevel::O2:
      p.cast_model_type = dtype;
      p.keep_batchnorm_fp32 = true;
      p.master_weights = true;
      break;
    case OptLevel::O3:
      p.cast_model_type = dtype;
      p.loss_scale = "1.0";
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
  CASTOR_CHECK(!p.cast_model_type || *p.cast_model_type == DType::Float32 || *p.cast_model_type == dtype,
               "amp: cast_model_type must be float32 or ", dtype_name(dtype), ", got ",
               dtype_name(*p.cast_model_type));
  CASTOR_CHECK(!p.keep_batchnorm_fp32 || p.cast_model_type, "amp: keep_batchnorm_fp32 needs cast_model_type");
  static_scale(p.loss_scale);  // validates
  scaler_options(p).validate();
  return p;
}

Amp::Amp(nn::Module& model, std::vector<optim::Optimizer*> optimizers, Properties properties, int num_losses)
    : model_(model), optimizers_(std::move(optimizers)), props_(std::move(properties)) {
  CASTOR_CHECK(num_losses >= 1, "amp: num_losses must be >= 1, got ", num_losses);
  for (optim::Optimizer* o : optimizers_) CASTOR_CHECK(o != nullptr, "amp: a null optimizer");
  for (int k = 0; k < num_losses; ++k)
    scalers_.push_back(std::make_unique<GradScaler>(scaler_options(props_), model_.named_parameters()));
}

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
  GradScaler& s = scaler(loss_id);
  bound_check(optimizer, "scale_loss");
  auto [it, fresh] = loss_of_.emplace(&optimizer, loss_id);
  CASTOR_CHECK(fresh || it->second == loss_id, "amp::scale_loss: this optimizer holds gradients of loss ",
               it->second, "; step it before backpropagating loss ", loss_id, " into it");
  return s.scale(loss);
}

void Amp::unscale_(optim::Optimizer& optimizer) {
  auto it = loss_of_.find(&bound_check(optimizer, "unscale_"));
  CASTOR_CHECK(it != loss_of_.end(), "amp::unscale_: no scale_loss() for this optimizer since its last step");
  scaler(it->second).unscale_(optimizer);
}

bool Amp::step(optim::Optimizer& optimizer) {
  auto it = loss_of_.find(&bound_check(optimizer, "step"));
  CASTOR_CHECK(it != loss_of_.end(), "amp::step: no scale_loss() for this optimizer since its last step");
  const int loss_id = it->second;
  const bool stepped = scaler(loss_id).step(optimizer);
  loss_of_.erase(it);
  bool others = false;  // optimizers still to step on this loss's scale this iteration
  for (auto& [opt, id] : loss_of_) others |= id == loss_id;
  if (!others) scaler(loss_id).update();
  return stepped;
}

StateDict Amp::model_state_dict() const {
  StateDict sd = model_.state_dict();
  std::map<const TensorImpl*, Tensor> masters;
  for (const optim::Optimizer* o : optimizers_)
    for (const auto& g : o->param_groups())
      for (const auto& slot : g.slots)
        if (slot.master.defined()) masters[slot.param.impl()] = slot.master;
  for (const auto& [name, p] : model_.named_parameters()) {
    auto it = masters.find(p.impl());
    if (it != masters.end()) sd[name] = it->second.detach();
  }
  return sd;
}

std::string Amp::param_signature() const {
  std::string sig;
  for (const auto& [name, p] : model_.named_parameters())
    sig += name + ":" + dtype_name(p.dtype()) + shape_str(p.shape()) + ";";
  return sig;
}

PrecisionState Amp::precision_state() const {
  PrecisionState st;
  for (size_t k = 0; k < scalers_.size(); ++k)
    for (auto& [key, t] : scalers_[k]->state_dict()) st.tensors["scaler." + std::to_string(k) + "." + key] = t;
  for (size_t j = 0; j < optimizers_.size(); ++j)
    for (auto& [key, t] : optimizers_[j]->state_dict()) st.tensors["optimizer." + std::to_string(j) + "." + key] = t;
  const Properties& p = props_;
  st.metadata = {{"format", "castor.amp.precision_state"},
                 {"version", std::to_string(PrecisionState::kVersion)},
                 {"opt_level", opt_level_name(p.level)},
                 {"dtype", dtype_name(p.dtype)},
                 {"autocast", bool_str(p.autocast)},
                 {"cast_model_type", p.cast_model_type ? dtype_name(*p.cast_model_type) : "none"},
                 {"keep_batchnorm_fp32", bool_str(p.keep_batchnorm_fp32)},
                 {"master_weights", bool_str(p.master_weights)},
                 {"loss_scale", p.loss_scale},
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
  CASTOR_CHECK(meta(st, "dtype") == dtype_name(props_.dtype), "amp: the checkpoint was saved with ",
               meta(st, "dtype"), ", this run uses ", dtype_name(props_.dtype));
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

std::unique_ptr<Amp> initialize(nn::Module& model, const std::vector<optim::Optimizer*>& optimizers,
                                OptLevel level, DType dtype, const Overrides& overrides, int num_losses) {
  Properties p = properties_for(level, dtype, overrides);
  if (p.cast_model_type) model.to(*p.cast_model_type, p.keep_batchnorm_fp32);
  for (optim::Optimizer* o : optimizers) {
    CASTOR_CHECK(o != nullptr, "amp::initialize: a null optimizer");
    o->set_master_weights(p.master_weights);
    o->set_rounding(p.rounding, p.rounding_seed);
  }
  return std::make_unique<Amp>(model, optimizers, std::move(p), num_losses);
}

}  // namespace castor::amp
