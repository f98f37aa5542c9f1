// Reading the model castor sample and castor export work on (train/loaded_model.h).
#include "train/loaded_model.h"

#include <filesystem>

#include "castor/checkpoint.h"
#include "castor/hf.h"
#include "castor/llama2c.h"
#include "castor/model_source.h"
#include "train/family.h"
#include "train/lora_run.h"
#include "train/task.h"

namespace castor::train {
namespace {

namespace fs = std::filesystem;

// The model `description` describes (its family's), with `weights` loaded (strictly; errors name `what`).
std::shared_ptr<models::LanguageModel> load_described(const StateDict& weights, const Json& description,
                                                      const std::string& what) {
  auto model = family_named(description.at("family").as_string())->build(description, what);
  try {
    model->load_state_dict(weights);
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": ", e.what()));
  }
  return model;
}

// The Llama of a llama2.c file (its sizes and weights).
std::shared_ptr<models::LanguageModel> load_llama2c_model(const std::string& path) {
  const formats::Llama2cWeights w = formats::read_llama2c(path);
  auto model = models::llama(formats::llama_config(w), /*seed=*/0);
  model->load_state_dict(w.state);
  return model;
}

}  // namespace

LoadedGpt load_gpt(const std::string& path, int64_t n_head, const std::string& lora_base, bool keep_blocks) {
  const formats::SourceFormat format = formats::source_format(path);
  if (format == formats::SourceFormat::HfDir || format == formats::SourceFormat::Gguf) {
    // Another tool's Llama, described as a run of it would be: made without weights (a Hugging Face directory's in
    // its 16-bit torch_dtype when it has one), then loaded tensor by tensor.
    LoadedGpt g;
    g.what = path;
    g.meta = formats::read_weights_header(path).metadata;
    g.config = castor_config(g.meta, path);
    const DType dtype = format == formats::SourceFormat::HfDir ? formats::read_hf_config(path).dtype : DType::Float32;
    {
      nn::LoadInitGuard empty(is_16bit_float(dtype) ? dtype : DType::Float32, /*placeholders=*/true);
      g.llama = family_named("llama")->build(formats::source_description(path), path);
    }
    formats::load_weights_into(*g.llama, path, nullptr, keep_blocks);
    return g;
  }
  const bool dir = format == formats::SourceFormat::CastorDir;
  std::error_code ec;
  if (format == formats::SourceFormat::Llama2c || format == formats::SourceFormat::Llmc) {
    LoadedGpt g;
    g.what = path;
    if (format == formats::SourceFormat::Llama2c)
      g.llama = load_llama2c_model(path);
    else
      g.weights = formats::load_gpt_init(path, n_head);
    g.meta = formats::read_weights_header(path).metadata;
    return g;
  }
  std::string used = path, what = path;
  Checkpoint ck;
  if (dir) {
    ck = read_checkpoint(path, &used);
    what = (fs::path(used) / "model.safetensors").string();
  } else {
    LoadedTensors file = load_safetensors(path);
    ck.model = std::move(file.tensors);
    ck.model_meta = std::move(file.metadata);
  }
  const auto found = ck.model_meta.find("castor.model");
  const std::string kind = found == ck.model_meta.end() ? "" : found->second;  // (the merge below rewrites the map)
  // (weights without castor metadata: nanoGPT's, a GPT's)
  const Family* family = kind.empty() ? nullptr : family_of_spelling(kind);
  CASTOR_CHECK(kind.empty() || family, path, ": a ", printable(kind), " checkpoint, not a language model's");
  const bool lora = is_lora_checkpoint(ck.model_meta);
  merge_lora_checkpoint(ck, what, lora_base);
  Json config = castor_config(ck.model_meta, what);
  const fs::path run = fs::path(used).parent_path().parent_path();  // RUN/checkpoints/step-N
  std::string run_dir = dir && fs::is_directory(run / "checkpoints", ec) ? run.string() : std::string();
  LoadedGpt g;
  g.config = std::move(config);
  g.what = what;
  g.train_state = std::move(ck.state);
  g.run_dir = std::move(run_dir);
  g.lora = lora;
  if (family && family->name != std::string("gpt"))  // (a GPT's exports take its weights with its config)
    g.llama = load_described(ck.model, model_description(g.config, what), what);
  else
    g.weights = formats::gpt_weights_from_safetensors(std::move(ck.model), ck.model_meta, n_head, what);
  g.meta = std::move(ck.model_meta);
  return g;
}

Json described(const LoadedGpt& g, const char* key) {
  const Json d = g.config.is_object() ? model_description(g.config, g.what) : Json();
  const Json* v = d.is_object() ? d.find(key) : nullptr;
  return v ? *v : Json();
}

}  // namespace castor::train
