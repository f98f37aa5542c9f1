// The model families a language-model run trains, one row each (gpt, llama): their --model presets, the flags that
// apply to them only, their defaults, how a run's config builds, checks and describes their model, and what --init
// reads. A new family is one row here (docs/design.md, "Model families").
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/formats.h"
#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/llama.h"
#include "castor/models.h"
#include "castor/state_dict.h"
#include "castor/train_config.h"
#include "train/settings.h"

namespace castor::train {

struct Family {
  const char* name;                // "gpt", "llama": the "family" of the description a run records
  const char* label;               // "GPT", "Llama": in messages
  std::vector<ModelKind> presets;  // its --model spellings
  Job job;                         // the settings rows that apply to this family only
  const char* features;            // what sets it apart, for `castor info` and the docs
  Dataset default_data;            // --data when not given
  double lr;                       // --lr, --warmup-steps and --steps when not given
  int64_t warmup_steps, steps;
  bool pads_vocab;  // the vocabulary rounds up to a multiple of 64 above 1024 (GPT's); else it is the tokenizer's
  // The preset's sizes where not given, checked naming the flags.
  void (*apply_sizes)(TrainConfig& c);
  // The model of `c` (its vocabulary resolved) checked before any step; castor::Error naming the field.
  void (*check)(const TrainConfig& c);
  // A new run with --init: the sizes of --init's model into `c` (a size flag given with another value is an error
  // naming both; the vocabulary checked against `data_dir`'s tokenizer). The weights load later, tensor by tensor
  // (build_run).
  void (*take_init_sizes)(TrainConfig& c, const std::string& data_dir);
  // castor eval of weights without castor metadata (--model): the sizes from their tensors' shapes, --n-head and (a
  // Llama's) --block-size, which no shape holds, into `c`; `tensors` become the model's state dict (a tied output
  // layer filled in). castor::Error naming `path` when a tensor or a size is missing.
  void (*take_file_sizes)(TrainConfig& c, StateDict& tensors, const Metadata& metadata, int64_t n_head, int64_t context,
                          const std::string& path);
  // The model of `c` with weights drawn from `seed` (a GPT's logits cover the first real_vocab tokens).
  std::shared_ptr<models::LanguageModel> (*make)(const TrainConfig& c, int64_t real_vocab, uint64_t seed);
  // The description of `c`'s model a run records (config.json's "model_config": "family" and the sizes), and the
  // model a description builds (weights from seed 0; castor::Error naming `what` for a bad description).
  Json (*describe)(const TrainConfig& c);
  std::shared_ptr<models::LanguageModel> (*build)(const Json& description, const std::string& what);
};

// The table, and the row of a --model (null for an image model), of a family name (null for none).
const std::vector<Family>& families();
const Family* family_of(ModelKind m);
const Family* family_named(const std::string& name);
const Family* family_of_spelling(const std::string& model);  // of a --model spelling ("llama-260k")
// The row of a language model's config (castor::Error for an image model).
const Family& family(const TrainConfig& c);
// The description a run's recorded settings give: config.json's "model_config" when recorded, else (runs recorded
// before it) the one its settings describe; null Json for an image model's run.
Json model_description(const Json& recorded, const std::string& what);

using formats::gpt_config;  // (castor/formats.h: the descriptions of a GPT and a Llama, and back)
using formats::gpt_description;
using formats::llama_config;
using formats::llama_description;

}  // namespace castor::train
