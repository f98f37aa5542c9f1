// LoRA adapters on Linear layers: targeting by PEFT's module-name rules, freezing, merging and unmerging.
#include "castor/lora.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"

namespace castor::nn {

namespace {

using NamedLinears = std::vector<std::pair<std::string, std::shared_ptr<Linear>>>;

// Every Linear under `m` with its path, in registration order; an adapter's own Linears are not listed.
void collect_linears(Module& m, const std::string& prefix, NamedLinears& out) {
  for (const auto& [name, child] : m.named_children()) {
    if (auto linear = std::dynamic_pointer_cast<Linear>(child)) {
      out.emplace_back(prefix + name, linear);
      continue;
    }
    collect_linears(*child, prefix + name + ".", out);
  }
}

NamedLinears all_linears(Module& model) {
  NamedLinears out;
  collect_linears(model, "", out);
  return out;
}

// PEFT's target_modules rule for a list of names: the path is the name or ends in "." + name.
bool matches(const std::string& path, const std::string& name) {
  const size_t n = name.size();
  return path == name ||
         (path.size() > n && path.compare(path.size() - n, n, name) == 0 && path[path.size() - n - 1] == '.');
}

std::string leaf_name(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// The Linears the config targets; castor::Error for names that match nothing (listing the Linears' names).
NamedLinears targets_of(Module& model, const LoraConfig& config) {
  const NamedLinears linears = all_linears(model);
  CASTOR_CHECK(!linears.empty(), "lora: ", model.type_name(), " has no Linear layer to adapt");
  const auto& names = config.target_modules;
  if (names.size() == 1 && names[0] == "all-linear") return all_linear_layers(model);
  std::vector<std::string> unmatched;
  for (const std::string& n : names)
    if (std::none_of(linears.begin(), linears.end(), [&](const auto& l) { return matches(l.first, n); }))
      unmatched.push_back(n);
  if (!unmatched.empty()) {
    std::set<std::string> valid;
    for (const auto& l : linears) valid.insert(leaf_name(l.first));
    std::string list;
    for (const std::string& v : valid) list += (list.empty() ? "" : ", ") + v;
    std::string bad;
    for (const std::string& u : unmatched) bad += (bad.empty() ? "\"" : ", \"") + u + "\"";
    CASTOR_CHECK(false, "lora: target module(s) ", bad, " match no Linear layer of ", model.type_name(),
                 "; valid names: ", list, ", all-linear (or a full path)");
  }
  NamedLinears out;
  for (const auto& l : linears)
    if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return matches(l.first, n); }))
      out.push_back(l);
  return out;
}

// A (r, in) drawn as the config says, from `gen`.
Tensor draw_a(const LoraConfig& c, int64_t r, int64_t in_features, Generator& gen) {
  if (c.init == LoraInit::Gaussian)
    return normal({r, in_features}, 0.0, 1.0 / static_cast<double>(r), DType::Float32, &gen);
  // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  return uniform({r, in_features}, -bound, bound, DType::Float32, &gen);
}

void attach(Linear& layer, const std::string& path, const LoraConfig& c, Generator& gen) {
  const int64_t r = c.rank_of(path);
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->lora_dropout = layer.register_module("lora_dropout", std::make_shared<Dropout>(c.dropout));
  adapter->lora_A = layer.register_module("lora_A", std::make_shared<Linear>(layer.in_features(), r, false));
  adapter->lora_B = layer.register_module("lora_B", std::make_shared<Linear>(r, layer.out_features(), false));
  adapter->scaling = c.scaling_of(path);
  NoGradGuard no_grad;
  adapter->lora_A->weight.copy_(draw_a(c, r, layer.in_features(), gen));
  adapter->lora_B->weight.zero_();
  adapter->lora_dropout->train(layer.is_training());
  adapter->lora_A->train(layer.is_training());
  adapter->lora_B->train(layer.is_training());
  layer.lora = adapter;
}

// A pattern's value for the module `name` (peft.utils.other.get_pattern_key and the dict's get), or `otherwise`.
template <class T>
T pattern_value(const std::vector<std::pair<std::string, T>>& pattern, const std::string& name, T otherwise) {
  for (const auto& [key, value] : pattern)
    if (std::regex_match(name, std::regex("(.*\\.)?(" + key + ")"))) return value;
  for (const auto& [key, value] : pattern)
    if (key == name) return value;
  return otherwise;
}

double scaling_for(int64_t r, double alpha, bool rslora) {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

}  // namespace

double LoraConfig::scaling() const { return scaling_for(r, alpha, rslora); }

int64_t LoraConfig::rank_of(const std::string& path) const {
  return pattern_value(rank_pattern, pattern_name ? pattern_name(path) : path, r);
}

double LoraConfig::scaling_of(const std::string& path) const {
  const std::string name = pattern_name ? pattern_name(path) : path;
  return scaling_for(pattern_value(rank_pattern, name, r), pattern_value(alpha_pattern, name, alpha), rslora);
}

void LoraConfig::validate() const {
  CASTOR_CHECK(r > 0, "LoraConfig: r must be positive, got ", r);
  CASTOR_CHECK(std::isfinite(alpha) && alpha > 0, "LoraConfig: alpha must be positive, got ", alpha);
  CASTOR_CHECK(dropout >= 0 && dropout < 1, "LoraConfig: dropout must be in [0, 1), got ", dropout);
  CASTOR_CHECK(!target_modules.empty(), "LoraConfig: target_modules is empty");
  for (const std::string& t : target_modules) {
    CASTOR_CHECK(!t.empty(), "LoraConfig: an empty target module name");
    CASTOR_CHECK(t != "all-linear" || target_modules.size() == 1,
                 "LoraConfig: \"all-linear\" cannot be combined with other target modules");
  }
  const auto check_key = [](const char* field, const std::string& key) {
    try {
      std::regex("(.*\\.)?(" + key + ")");
    } catch (const std::regex_error&) {
      CASTOR_CHECK(false, "LoraConfig: ", field, " key \"", key, "\" is not a regular expression");
    }
  };
  for (const auto& [key, rank] : rank_pattern) {
    check_key("rank_pattern", key);
    CASTOR_CHECK(rank > 0, "LoraConfig: rank_pattern \"", key, "\": the rank must be positive, got ", rank);
  }
  for (const auto& [key, a] : alpha_pattern) {
    check_key("alpha_pattern", key);
    CASTOR_CHECK(std::isfinite(a) && a > 0, "LoraConfig: alpha_pattern \"", key, "\": alpha must be positive, got ", a);
  }
}

Tensor LoraAdapter::delta(const Tensor& x) const {
  const Tensor h = (*lora_A)((*lora_dropout)(x));  // (*, r)
  // A power of two >= 1 multiplies exactly (no rounding, no underflow) in float32 and bfloat16, so it may scale B's
  // (out, r) weight instead of the (*, out) product: every value and gradient the same (the products and their sums
  // scale exactly), one pass over the activations fewer each way. Not in float16, whose narrow range could overflow
  // where the product's multiply would not, nor past lora_B's hooks.
  const DType runs_in = amp::is_autocast_enabled() ? amp::autocast_state().dtype : h.dtype();
  int exponent = 0;
  const bool power_of_two = std::frexp(scaling, &exponent) == 0.5 && scaling >= 1;
  if (scaling != 1 && power_of_two && runs_in != DType::Float16 && !lora_B->has_forward_hooks())
    return F::linear(h, lora_B->weight * scaling);
  const Tensor y = (*lora_B)(h);  // (*, out)
  return scaling == 1 ? y : y * scaling;
}

std::vector<std::string> apply_lora(Module& model, const LoraConfig& config) {
  config.validate();
  CASTOR_CHECK(lora_layers(model).empty(), "lora: ", model.type_name(), " already has LoRA adapters");
  const NamedLinears targets = targets_of(model, config);
  for (const auto& [path, layer] : targets)
    CASTOR_CHECK(config.rank_of(path) <= std::min(layer->in_features(), layer->out_features()), "lora: rank ",
                 config.rank_of(path), " is larger than ", path, "'s dimensions (", layer->out_features(), ", ",
                 layer->in_features(), ")");
  for (Tensor p : model.parameters()) p.requires_grad_(false);
  Generator gen(config.seed);
  std::vector<std::string> paths;
  for (const auto& [path, layer] : targets) {
    attach(*layer, path, config, gen);
    paths.push_back(path);
  }
  return paths;
}

NamedLinears linear_layers(Module& model) { return all_linears(model); }

NamedLinears all_linear_layers(Module& model) {
  NamedLinears linears = all_linears(model);
  if (!linears.empty()) linears.pop_back();
  return linears;
}

std::vector<std::pair<std::string, std::shared_ptr<Linear>>> lora_layers(Module& model) {
  NamedLinears out;
  for (auto& l : all_linears(model))
    if (l.second->lora) out.push_back(std::move(l));
  return out;
}

StateDict lora_state_dict(Module& model) {
  StateDict sd;
  for (const auto& [path, layer] : lora_layers(model)) {
    sd.emplace(path + ".lora_A.weight", layer->lora->lora_A->weight.detach());
    sd.emplace(path + ".lora_B.weight", layer->lora->lora_B->weight.detach());
  }
  return sd;
}

void merge_lora(Module& model) {
  NoGradGuard no_grad;
  for (const auto& [path, layer] : lora_layers(model)) {
    LoraAdapter& a = *layer->lora;
    if (a.merged()) continue;
    CASTOR_CHECK(!layer->quantized, path, ": the adapter cannot be merged into a ",
                 quant::block_type(layer->quantized->type).name, " base (quantized weights stay frozen blocks)");
    Tensor w = layer->weight.detach();
    const Tensor ba = mm(a.lora_B->weight.detach().to(DType::Float32), a.lora_A->weight.detach().to(DType::Float32));
    const Tensor merged = (w.to(DType::Float32) + ba * a.scaling).to(w.dtype());  // (out, in), one rounding
    a.unmerged_weight = w.clone();
    w.copy_(merged);
  }
}

void unmerge_lora(Module& model) {
  NoGradGuard no_grad;
  for (const auto& [path, layer] : lora_layers(model)) {
    LoraAdapter& a = *layer->lora;
    if (!a.merged()) continue;
    layer->weight.detach().copy_(a.unmerged_weight);
    a.unmerged_weight = Tensor();
  }
}

void merge_and_unload(Module& model) {
  merge_lora(model);
  for (const auto& [path, layer] : lora_layers(model)) {
    for (const char* child : {"lora_dropout", "lora_A", "lora_B"}) layer->unregister_module(child);
    layer->lora.reset();
  }
}

}  // namespace castor::nn
