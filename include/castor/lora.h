// LoRA (Hu et al.; Hugging Face PEFT's conventions): low-rank adapters on a model's Linear layers, its base frozen.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "castor/nn.h"

namespace castor::nn {

// How adapter A is drawn (B always starts at zero, so the adapted model starts as the base).
enum class LoraInit {
  KaimingUniform,  // PEFT's default (init_lora_weights=True): nn.Linear's kaiming_uniform_(a=sqrt(5)) on A (r, in)
  Gaussian,        // init_lora_weights="gaussian": A ~ N(0, 1/r)
};

// PEFT's LoraConfig: r, lora_alpha, lora_dropout, target_modules, use_rslora, init_lora_weights.
struct LoraConfig {
  int64_t r = 8;
  double alpha = 8;
  double dropout = 0;
  // Module names: a name matches a Linear whose path is the name or ends in "." + name ("c_attn" matches
  // "transformer.h.0.attn.c_attn"); {"all-linear"} takes every Linear but the output layer (the last one registered,
  // as PEFT leaves out the output embedding).
  std::vector<std::string> target_modules = {"all-linear"};
  bool rslora = false;  // scaling alpha / sqrt(r) instead of alpha / r
  LoraInit init = LoraInit::KaimingUniform;
  uint64_t seed = 0;  // of A's draw
  // PEFT's rank_pattern and alpha_pattern, (key, value) in the order written: a targeted Linear whose name matches
  // "(.*\.)?(KEY)" whole takes the value of the first such KEY (peft.utils.other.get_pattern_key; a key equal to the
  // name where no key matches), else r and alpha. Keys are regular expressions (ECMAScript's, which agree with
  // Python's on module names: dots, classes, alternatives, repeats). The name is pattern_name(path) (the module's
  // name on the model PEFT adapted: a Hugging Face base's), the path when pattern_name is unset.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::function<std::string(const std::string&)> pattern_name;
  double scaling() const;  // alpha / r (alpha / sqrt(r) with rslora)
  // The rank and the scaling of the adapter on the Linear at `path`.
  int64_t rank_of(const std::string& path) const;
  double scaling_of(const std::string& path) const;
  void validate() const;  // a castor::Error naming the field otherwise
};

// The adapter apply_lora attaches to a Linear: its modules are the Linear's children "lora_A" (r, in) and "lora_B"
// (out, r) (no bias) and "lora_dropout", so their names are PEFT's: "<path>.lora_A.weight", "<path>.lora_B.weight".
// The Linear's forward adds scaling * B(A(dropout(x))) unless it is merged into the weight.
struct LoraAdapter {
  std::shared_ptr<Linear> lora_A, lora_B;
  std::shared_ptr<Dropout> lora_dropout;
  double scaling = 1;
  Tensor unmerged_weight;  // the base weight as it was before merge_lora (defined while merged)
  bool merged() const { return unmerged_weight.defined(); }
  Tensor delta(const Tensor& x) const;  // scaling * B(A(dropout(x))): (*, in) -> (*, out)
};

// Freezes every parameter of `model` (requires_grad false: no gradient, no optimizer state, and products with a
// frozen weight compute no weight gradient), then attaches a trainable adapter to each Linear the config targets.
// Returns the adapted Linears' paths. Errors (castor::Error, nothing changed): an invalid config, a rank larger than
// a target's in or out features, target names that match no Linear (the valid names are listed), a model that
// already has adapters.
std::vector<std::string> apply_lora(Module& model, const LoraConfig& config);

// PEFT's all-linear: (path, Linear) of every Linear of `model` but the output layer (the last one registered), in
// registration order; an adapter's own Linears are not listed. QLoRA quantizes these (transformers leaves the output
// layer, and the embeddings, unquantized).
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> all_linear_layers(Module& model);
// (path, Linear) of every Linear of `model`, the output layer too, in registration order (an adapter's own Linears
// are not listed).
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> linear_layers(Module& model);
// (path, Linear) of every Linear of `model` with an adapter, in registration order.
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> lora_layers(Module& model);
// The adapters' parameters (PEFT's get_peft_model_state_dict without the "base_model.model." prefix).
StateDict lora_state_dict(Module& model);
// W += scaling * B A in float32, rounded once into W's dtype, for every adapted Linear (a no-op for merged ones);
// the forward then skips the adapter path. unmerge_lora puts back the weight as it was, bit for bit.
void merge_lora(Module& model);
void unmerge_lora(Module& model);
// PEFT's merge_and_unload: merges and removes the adapters, leaving a plain model (still frozen).
void merge_and_unload(Module& model);

}  // namespace castor::nn
