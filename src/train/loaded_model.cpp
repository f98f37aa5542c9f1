// Reading the model castor sample, castor eval and castor export work on (train/loaded_model.h).
#include "train/loaded_model.h"

#include <filesystem>

#include "castor/chat_data.h"
#include "castor/checkpoint.h"
#include "castor/formats.h"
#include "castor/hf.h"
#include "castor/llama2c.h"
#include "castor/model_source.h"
#include "castor/models.h"
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

// The model to sample: a Llama as loaded, a GPT built for the tokenizer's vocabulary (its padding never drawn).
std::shared_ptr<models::LanguageModel> sampled_model(LoadedGpt& g, const data::Tokenizer& tok, const std::string& dir) {
  if (g.llama) {
    // (a Hugging Face model's embedding may have more rows than its tokenizer has tokens: Qwen2's 151936 for 151669)
    CASTOR_CHECK(tok.hf() ? tok.vocab_size() <= g.llama->vocab_size() : tok.vocab_size() == g.llama->vocab_size(), dir,
                 ": the tokenizer has ", tok.vocab_size(), " tokens, ", g.what, " was made for ",
                 g.llama->vocab_size());
    return g.llama;
  }
  models::GPTConfig& config = g.weights.config;
  CASTOR_CHECK(tok.vocab_size() <= config.vocab_size, dir, ": the tokenizer has ", tok.vocab_size(),
               " tokens, more than the model's vocabulary of ", config.vocab_size, " (", g.what, ")");
  CASTOR_CHECK(config.real_vocab_size == 0 || config.real_vocab_size == tok.vocab_size(), dir, ": the tokenizer has ",
               tok.vocab_size(), " tokens, ", g.what, " was made for ", config.real_vocab_size);
  config.real_vocab_size = tok.vocab_size();
  auto model = models::gpt(config);
  model->load_state_dict(g.weights.state);
  return model;
}

// LoadedLm::end_ids of `g` and its tokenizer.
std::set<int64_t> end_ids(const LoadedGpt& g, const data::Tokenizer& tok) {
  std::set<int64_t> ids;
  if (tok.bpe()) ids.insert(data::BpeVocabulary::kBos);
  if (tok.kind() != "char") {
    const data::ChatTokenizer ct = data::chat_tokenizer(tok, /*need_template=*/false);
    for (int64_t id : {ct.eos_id, ct.eot_id})
      if (id >= 0) ids.insert(id);
  }
  const Json eos = described(g, "eos_token_id");
  for (const Json& id : eos.is_array() ? eos.as_array() : Json::Array{eos})
    if (id.is_int()) ids.insert(id.as_int());
  return ids;
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
  // A LoRA run over a quantized base (a GGUF file's blocks, or --quantize-base), sampled or evaluated: its base in
  // blocks as the run trained on it, with the adapters beside them (merging would make the base dense).
  const bool blocks = lora && keep_blocks && family && base_in_blocks(ck, what, lora_base);
  if (!blocks) merge_lora_checkpoint(ck, what, lora_base);
  Json config = castor_config(ck.model_meta, what);
  const fs::path run = fs::path(used).parent_path().parent_path();  // RUN/checkpoints/step-N
  std::string run_dir = dir && fs::is_directory(run / "checkpoints", ec) ? run.string() : std::string();
  LoadedGpt g;
  g.config = std::move(config);
  g.what = what;
  g.train_state = std::move(ck.state);
  g.run_dir = std::move(run_dir);
  g.lora = lora;
  if (blocks)
    g.llama = adapted_model(ck, what, lora_base), g.train_state.clear();  // (the adapters' optimizer state)
  else if (family && family->name != std::string("gpt"))  // (a GPT's exports take its weights with its config)
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

LoadedLm load_language_model(const std::string& path, int64_t n_head, const std::string& lora_base,
                             const std::string& tokenizer_dir, const std::string& lora) {
  LoadedGpt g = load_gpt(path, n_head, lora_base, /*keep_blocks=*/true);
  for (const auto& [name, t] : g.llama ? g.llama->state_dict() : g.weights.state)
    formats::check_finite(g.what, name, t);
  std::string dir = tokenizer_dir.empty() ? model_tokenizer_dir(path, g.config) : tokenizer_dir;
  CASTOR_CHECK(!dir.empty(), "--tokenizer-dir: missing; ", g.what,
               " records no data directory to decode with, and no tokenizer.bin is beside it");
  data::Tokenizer tok = data::Tokenizer::load(dir);
  // The ids are the model's vocabulary's: a tokenizer of another one would decode them as other tokens.
  const data::VocabularyId model_vocab = model_vocabulary(path, g.config), vocab = tok.vocabulary_id();
  CASTOR_CHECK(data::same_vocabulary(model_vocab, vocab), tokenizer_dir.empty() ? "" : "--tokenizer-dir ", dir,
               " holds the vocabulary [", vocab.describe(), "], but ", g.what, " was trained in [",
               model_vocab.describe(),
               "]: its ids would decode as other tokens; give the folder of the model's "
               "vocabulary");
  std::shared_ptr<models::LanguageModel> model = sampled_model(g, tok, dir);
  if (!lora.empty()) {
    CASTOR_CHECK(!g.lora, "--lora: ", g.what, " is a LoRA run's (its adapters merged already); give its base");
    apply_peft_adapter(*model, g.llama ? ModelKind::Llama : ModelKind::Gpt, path, lora);
  }
  model->eval();
  std::set<int64_t> ends = end_ids(g, tok);
  return {std::move(model), std::move(tok), g.what, dir, std::move(ends)};
}

}  // namespace castor::train
