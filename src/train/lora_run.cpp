// LoRA runs of castor train: adapter settings from the flags or PEFT's adapter_config.json, the base's checksum,
// adapter-only checkpoints, merging a run's adapters into its base, and PEFT's files.
#include "train/lora_run.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <type_traits>
#include <map>
#include <set>

#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llmc.h"
#include "castor/output_dir.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/model_source.h"
#include "train/family.h"
#include "train/settings.h"
#include "train/task.h"

namespace castor::train {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kBaseKey = "castor.lora_base";

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(list.substr(start, comma - start));
  out.push_back(list.substr(start));
  return out;
}

// A per-module pattern as config.json records it: [[key, value], ...] in its order.
template <class T>
Json pattern_json(const std::vector<std::pair<std::string, T>>& pattern) {
  Json::Array out;
  for (const auto& [key, value] : pattern) out.push_back(Json::Array{key, value});
  return out;
}

// A pattern from [[key, value], ...] (config.json's, or an object of Json::parse_ordered): an integer rank or a
// positive alpha each; castor::Error naming `what` otherwise.
template <class T>
std::vector<std::pair<std::string, T>> pattern_of(const Json& pairs, const std::string& what) {
  std::vector<std::pair<std::string, T>> out;
  for (const Json& p : pairs.as_array()) {
    const Json& key = p.as_array().at(0);
    const Json& value = p.as_array().at(1);
    if constexpr (std::is_same_v<T, int64_t>)
      CASTOR_CHECK(value.is_int() && value.as_int() > 0, what, " ", key.dump(), ": ", value.dump(),
                   " is not a positive integer rank");
    else
      CASTOR_CHECK(value.is_number() && value.as_double() > 0, what, " ", key.dump(), ": ", value.dump(),
                   " is not a positive alpha");
    out.emplace_back(key.as_string(), std::is_same_v<T, int64_t> ? T(value.as_int()) : T(value.as_double()));
  }
  return out;
}

// Copies `tensors` into the model's adapters: exactly its adapter keys, each of its shape. castor::Error naming `what`.
void load_adapters(nn::Module& model, const StateDict& tensors, const std::string& what) {
  const StateDict own = nn::lora_state_dict(model);
  std::string missing, unexpected;
  for (const auto& [k, t] : own)
    if (!tensors.count(k)) missing += (missing.empty() ? "" : ", ") + k;
  for (const auto& [k, t] : tensors)
    if (!own.count(k)) unexpected += (unexpected.empty() ? "" : ", ") + k;
  CASTOR_CHECK(missing.empty() && unexpected.empty(), what, ": the adapters do not fit the model (",
               missing.empty() ? "" : "missing " + missing, missing.empty() || unexpected.empty() ? "" : "; ",
               unexpected.empty() ? "" : "unexpected " + unexpected, ")");
  for (const auto& [k, t] : own)
    CASTOR_CHECK(tensors.at(k).shape() == t.shape() && is_floating(tensors.at(k).dtype()), what, ": ", k, " is ",
                 tensors.at(k).describe(), ", the model's adapter is ", shape_str(t.shape()),
                 " (another rank, or another base?)");
  NoGradGuard no_grad;
  for (const auto& [k, t] : own) Tensor(t).copy_(tensors.at(k));
}

}  // namespace

std::string weights_checksum(const std::string& path) {
  if (!formats::is_source(path, formats::SourceFormat::HfDir)) return file_checksum64_hex(path);
  std::string sums;  // config.json's and every safetensors file's, in name order
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().filename() == "config.json" || e.path().extension() == ".safetensors" ||
        e.path().filename() == "model.safetensors.index.json")
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) sums += fs::path(f).filename().string() + " " + file_checksum64_hex(f) + "\n";
  return checksum64_hex(std::span(reinterpret_cast<const uint8_t*>(sums.data()), sums.size()));
}

namespace {

// The adapter config the LoRA settings describe (--lora-rank, --lora-alpha, ...).
// A Llama's targets in either naming, Castor's (wq, w2, output) or Hugging Face's and PEFT's (q_proj, down_proj,
// lm_head): the same layers.
// --init-lora's per-module patterns match the modules' names on the model PEFT adapted: a Hugging Face base's names
// (model.layers.0.self_attn.q_proj), else Castor's.
nn::LoraConfig lora_config(const TrainConfig& c) {
  std::vector<std::string> targets = split_commas(c.lora_targets);
  if (family_of(c.model) == family_named("llama"))
    for (std::string& t : targets) t = formats::hf_target_name(t, /*to_castor=*/true);
  std::function<std::string(const std::string&)> hf_name;
  if ((!c.lora_rank_pattern.empty() || !c.lora_alpha_pattern.empty()) &&
      formats::is_source(c.init, formats::SourceFormat::HfDir))
    hf_name = [](const std::string& path) {
      const std::string name = formats::file_name(formats::hf_layout(), path + ".weight");
      return name.empty() ? path : name.substr(0, name.size() - std::string(".weight").size());
    };
  return {.r = c.lora_rank,
          .alpha = c.lora_alpha,
          .dropout = c.lora_dropout,
          .target_modules = std::move(targets),
          .rslora = c.rslora,
          .seed = c.seed,
          .rank_pattern = c.lora_rank_pattern,
          .alpha_pattern = c.lora_alpha_pattern,
          .pattern_name = std::move(hf_name)};
}

// Error unless `file` still has the checksum recorded when the run started.
void check_base_checksum(const std::string& file, const std::string& recorded, const std::string& what) {
  std::error_code ec;
  CASTOR_CHECK(fs::exists(file, ec), what, ": the LoRA base ", file,
               " is missing (moved or deleted?); give the file where it is now with --lora-base PATH");
  const std::string now = weights_checksum(file);
  CASTOR_CHECK(now == recorded, what, ": the LoRA base ", file, " changed since the run started (checksum ", now,
               ", recorded ", recorded, "); the adapters fit only the base they were trained on");
}

// PEFT's target_modules: the distinct names of the adapted layers (Hugging Face's, `hf`, on a Hugging Face base).
Json::Array target_names(nn::Module& model, bool hf) {
  std::set<std::string> names;
  for (const auto& [path, layer] : nn::lora_layers(model)) {
    const std::string name = path.substr(path.rfind('.') + 1);
    names.insert(hf ? formats::hf_target_name(name, /*to_castor=*/false) : name);
  }
  return Json::Array(names.begin(), names.end());
}

// --init-lora's adapter_config.json as LoRA settings, into `c`; a given flag that differs is an error.
void take_peft_config(TrainConfig& c) {
  const std::string file = c.init_lora + "/adapter_config.json";
  try {
    const std::vector<uint8_t> bytes = read_file(file);
    const std::string text(bytes.begin(), bytes.end());
    const Json j = Json::parse(text);
    CASTOR_CHECK(j.is_object() && j.find("peft_type") && j.at("peft_type") == Json("LORA"),
                 "not a LoRA adapter (peft_type \"LORA\")");
    const Json& targets = j.at("target_modules");
    std::string list;
    if (targets.is_string())
      list = targets.as_string();
    else
      for (const Json& t : targets.as_array())  // (a Hugging Face base's names, q_proj, ..., as Castor's)
        list += (list.empty() ? "" : ",") + (formats::is_source(c.init, formats::SourceFormat::HfDir)
                                                 ? formats::hf_target_name(t.as_string(), /*to_castor=*/true)
                                                 : t.as_string());
    // What would make the adapters compute other than PEFT's (DoRA, trained biases, some layers only) is refused by
    // name rather than silently dropped; a rank of 0 would drop the adapters altogether. Per-module ranks and alphas
    // are taken in the file's order (PEFT takes the first key that matches a module).
    const Json& r = j.at("r");
    CASTOR_CHECK(r.is_int() && r.as_int() > 0, "\"r\" ", r.dump(), ": the adapters' rank must be a positive integer");
    const Json ordered = Json::parse_ordered(text);
    const auto pattern = [&](const char* key) {
      const Json* v = j.find(key);
      if (!v || v->is_null()) return Json(Json::Array{});
      CASTOR_CHECK(v->is_object(), "\"", key, "\" ", v->dump(), ": not an object of module names");
      Json pairs;
      for (const Json& p : ordered.as_array())
        if (p.as_array()[0] == Json(key)) pairs = p.as_array()[1];
      CASTOR_ASSERT(pairs.is_array(), "parse_ordered lost ", key);
      return pairs;
    };
    std::vector<std::pair<std::string, int64_t>> rank_pattern = pattern_of<int64_t>(pattern("rank_pattern"),
                                                                                    "\"rank_pattern\"");
    std::vector<std::pair<std::string, double>> alpha_pattern = pattern_of<double>(pattern("alpha_pattern"),
                                                                                   "\"alpha_pattern\"");
    nn::LoraConfig{.rank_pattern = rank_pattern, .alpha_pattern = alpha_pattern}.validate();  // (their keys)
    for (const auto& [key, plain] : {std::pair<const char*, Json>{"use_dora", Json(false)},
                                     {"lora_bias", Json(false)},
                                     {"bias", Json("none")},
                                     {"layers_to_transform", Json()},
                                     {"modules_to_save", Json()}})
      if (const Json* v = j.find(key))
        CASTOR_CHECK(*v == plain || (plain.is_null() && v->is_array() && v->as_array().empty()), "\"", key, "\" ",
                     v->dump(), ": not supported (Castor's adapters are plain LoRA on every targeted layer: ", key, " ",
                     plain.dump(), ")");
    const Json* rs = j.find("use_rslora");
    const Json* p = j.find("lora_dropout");
    const TrainConfig file_config{.lora_rank = r.as_int(),
                                  .lora_alpha = j.at("lora_alpha").as_double(),
                                  .lora_dropout = p ? p->as_double() : 0.0,
                                  .lora_targets = list,
                                  .rslora = rs && rs->as_bool()};
    auto take = [&](const char* flag, auto member) {
      CASTOR_CHECK(!c.given(flag) || c.*member == file_config.*member, flag, " ", Json(c.*member).dump(),
                   " differs from the file's ", Json(file_config.*member).dump());
      c.*member = file_config.*member;
    };
    take("--lora-rank", &TrainConfig::lora_rank);
    take("--lora-alpha", &TrainConfig::lora_alpha);
    take("--lora-dropout", &TrainConfig::lora_dropout);
    take("--lora-targets", &TrainConfig::lora_targets);
    take("--rslora", &TrainConfig::rslora);
    c.lora_rank_pattern = std::move(rank_pattern);
    c.lora_alpha_pattern = std::move(alpha_pattern);
  } catch (const Error& e) {
    throw Error(detail::cat("--init-lora ", file, ": ", e.what()));
  }
}

}  // namespace

std::string lora_base_of(const Checkpoint& ck, const std::string& lora_base) {
  return lora_base.empty() ? ck.model_meta.at(kBaseKey) : lora_base;
}

std::shared_ptr<models::LanguageModel> adapted_model(const Checkpoint& ck, const std::string& what,
                                                     const std::string& lora_base) {
  const Json config = castor_config(ck.model_meta, what);
  CASTOR_CHECK(config.is_object(), what, ": a LoRA checkpoint without its settings (castor.config)");
  TrainConfig c = resume_config(TrainConfig{}, config, what);
  const Family* family = family_of(c.model);
  CASTOR_CHECK(family, what, ": a LoRA run on a ", name(c.model), ", not a language model");
  const std::string base = lora_base_of(ck, lora_base);
  c.init = base;  // (where it is now: lora_config reads its kind)
  if (!c.init_checksum.empty()) check_base_checksum(base, c.init_checksum, what);
  const Json* real_vocab = config.find("real_vocab_size");
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::LoadInitGuard empty(DType::Float32, /*placeholders=*/true);  // (the base loads below, tensor by tensor)
    model = make_language_model(c, real_vocab && real_vocab->is_int() ? real_vocab->as_int() : c.vocab_size,
                                /*seed=*/0);
  }
  try {
    load_base(*model, base, c);
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(msg.rfind(base, 0) == 0 ? msg : detail::cat(what, ": the LoRA base ", base, ": ", msg));
  }
  nn::apply_lora(*model, lora_config(c));
  load_adapters(*model, ck.model, what);
  return model;
}

nn::LoraConfig run_lora_config(const Checkpoint& ck, const std::string& what) {
  return lora_config(resume_config(TrainConfig{}, castor_config(ck.model_meta, what), what));
}

bool base_in_blocks(const Checkpoint& ck, const std::string& what, const std::string& lora_base) {
  return formats::is_source(lora_base_of(ck, lora_base), formats::SourceFormat::Gguf) ||
         resume_config(TrainConfig{}, castor_config(ck.model_meta, what), what).quantize_base != quant::BlockType::F32;
}

void resolve_init_dir(TrainConfig& c) {
  std::error_code ec;
  if (c.init.empty() || !fs::is_directory(c.init, ec) || formats::is_source(c.init, formats::SourceFormat::HfDir))
    return;
  const std::optional<std::string> ck = is_checkpoint_dir(c.init) ? c.init : latest_checkpoint(c.init);
  CASTOR_CHECK(ck.has_value(), "--init ", c.init,
               ": a directory without a checkpoint (expected a run directory, "
               "a checkpoint folder or a weights file)");
  const std::string file = (fs::path(*ck) / "model.safetensors").string();
  CASTOR_CHECK(!is_lora_checkpoint(read_safetensors_header(file).metadata), "--init ", c.init,
               ": a LoRA run's checkpoint holds its adapters only; write the merged model with castor export "
               "--merge-lora and start from that file");
  c.init = file;
}

void check_lora_flags(TrainConfig& c) {
  if (!c.init_lora.empty()) take_peft_config(c);
  for (const char* flag : {"--lora-alpha", "--lora-dropout", "--lora-targets", "--rslora", "--quantize-base"})
    CASTOR_CHECK(!c.given(flag) || c.lora_rank > 0, flag, ": needs --lora-rank (LoRA fine-tuning of an --init base)");
  CASTOR_CHECK(c.double_quant || c.quantize_base == quant::BlockType::NF4,
               "--no-double-quant: only NF4's absmaxes are double-quantized (--quantize-base nf4)");
  CASTOR_CHECK(c.lora_rank == 0 || !c.init.empty(), c.init_lora.empty() ? "--lora-rank" : "--init-lora",
               ": needs --init (the base model to fine-tune: a run directory or a weights file)");
}

void check_lora_base(const TrainConfig& c) {
  if (c.lora_rank > 0 && !c.init_checksum.empty()) check_base_checksum(c.init, c.init_checksum, "--init");
}

void apply_run_lora(const TrainConfig& c, nn::Module& model) {
  try {
    nn::apply_lora(model, lora_config(c));
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(detail::cat(msg.find("target module") != std::string::npos ? "--lora-targets " + c.lora_targets
                                                                           : detail::cat("--lora-rank ", c.lora_rank),
                            ": ", msg));
  }
  // An output layer that shares the embedding's matrix (a tied GPT's lm_head, a tied Llama's output): merging an
  // adapter there would change the embedding too, which PEFT warns of; refused before any step.
  const nn::NamedTensors params = model.named_parameters();
  for (const auto& [path, layer] : nn::lora_layers(model))
    for (const auto& [name, p] : params)
      CASTOR_CHECK(p.impl() != layer->weight.impl() || name == path + ".weight", "--lora-targets ", c.lora_targets,
                   ": ", path, " shares its weight with ", name,
                   " (tied), so merging its adapter would change both; leave it out (all-linear does)",
                   family_of(c.model) == family_named("llama") ? ", or train the base with --untied" : "");
  if (c.init_lora.empty()) return;
  const std::string file = c.init_lora + "/adapter_model.safetensors";
  StateDict adapters;
  for (auto& [k, t] : load_safetensors(file).tensors) {
    CASTOR_CHECK(k.rfind(kPeftPrefix, 0) == 0, "--init-lora ", file, ": key \"", k, "\" does not start with \"",
                 kPeftPrefix, "\" (not a PEFT adapter file)");
    adapters.emplace(k.substr(std::string(kPeftPrefix).size()), t);
  }
  if (formats::is_source(
          c.init, formats::SourceFormat::HfDir))  // Hugging Face's names and rotary rows, as write_peft wrote them
    adapters = formats::hf_adapters(dynamic_cast<models::Llama&>(model).config(), adapters, /*to_castor=*/true);
  load_adapters(model, adapters, "--init-lora " + file);
}

void apply_peft_adapter(nn::Module& model, ModelKind kind, const std::string& base, const std::string& dir) {
  TrainConfig c;
  c.model = kind, c.init = base, c.init_lora = dir;
  try {
    check_lora_flags(c);  // the adapter's settings from its adapter_config.json
    apply_run_lora(c, model);
  } catch (const Error& e) {
    std::string msg = e.what();  // (named by the flag given: --lora)
    if (msg.rfind("--init-lora ", 0) == 0) msg.replace(0, 11, "--lora");
    throw Error(msg);
  }
  const auto linears = nn::lora_layers(model);
  if (std::none_of(linears.begin(), linears.end(), [](const auto& l) { return l.second->quantized != nullptr; }))
    nn::merge_and_unload(model);
}

void keep_adapters(Checkpoint& ck, const Json& config) {
  const Json* rank = config.find("lora_rank");
  if (!rank || !rank->is_int() || rank->as_int() == 0) return;
  StateDict adapters;
  for (auto& [k, t] : ck.model)
    if (k.find(".lora_") != std::string::npos) adapters.emplace(k, t);
  ck.model = std::move(adapters);
  std::erase_if(ck.model_each,
                [](const Checkpoint::LazyTensor& t) { return t.name.find(".lora_") == std::string::npos; });
  ck.model_meta[kBaseKey] = config.at("init").as_string();
}

bool is_lora_checkpoint(const Metadata& meta) { return meta.count(kBaseKey) > 0; }

void pin_lora_base(const TrainConfig& c) {
  const fs::path dir = fs::path(c.init).parent_path();
  if (c.lora_rank == 0 || !is_checkpoint_dir(dir.string())) return;
  const std::string pin = (dir / kLoraRunsFile).string(), run = absolute_path(c.out);
  std::string runs;
  if (file_exists(pin)) {
    const std::vector<uint8_t> bytes = read_file(pin);
    runs.assign(bytes.begin(), bytes.end());
  }
  if (("\n" + runs).find("\n" + run + "\n") != std::string::npos) return;
  try {
    atomic_write_file(pin, runs + run + "\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "note: %s (the base run's --keep may prune this LoRA run's base)\n", e.what());
  }
}

void load_base(nn::Module& model, const std::string& path, const TrainConfig& c) {
  if (c.quantize_base == quant::BlockType::F32)
    return formats::load_weights_into(model, path, nullptr, /*keep_blocks=*/true);
  const quant::BlockTypeInfo& type = quant::block_type(c.quantize_base);
  std::map<std::string, std::shared_ptr<nn::Linear>> pending;  // by weight name
  for (const auto& [name, layer] : nn::all_linear_layers(model))
    if (layer->in_features() % type.block == 0) pending.emplace(name + ".weight", layer);
  formats::load_weights_into(
      model, path,
      [&](const std::string& name) {
        const auto it = pending.find(name);
        if (it == pending.end()) return;
        it->second->quantize_weight(type.id, c.double_quant && type.id == quant::BlockType::NF4);
        pending.erase(it);
        empty_cache();  // the dense weight's memory back to the system, not kept for reuse
      },
      /*keep_blocks=*/true);
}

void load_model_file(nn::Module& model, const StateDict& tensors, const Metadata& meta, const std::string& what) {
  if (is_lora_checkpoint(meta)) return load_adapters(model, tensors, what);
  model.load_state_dict(tensors, /*strict=*/true);
}

void merge_lora_checkpoint(Checkpoint& ck, const std::string& what, const std::string& lora_base) {
  if (!is_lora_checkpoint(ck.model_meta)) return;
  auto model = adapted_model(ck, what, lora_base);
  for (const auto& [path, layer] : nn::all_linear_layers(*model))  // a quantized base: its blocks' values
    if (layer->quantized) layer->dequantize_weight(model->parameters().front().dtype());
  nn::merge_and_unload(*model);
  ck.model = model->state_dict();
  ck.model_meta.erase(kBaseKey);
  ck.state.clear();  // the optimizer state is the adapters': none of the merged model's
  // The settings of a plain run of these weights: no adapters (its init stays the base it came from).
  Json config = castor_config(ck.model_meta, what);
  const Json plain = settings_json(TrainConfig{});
  for (const char* flag : {"--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-targets", "--rslora", "--init-lora",
                           "--quantize-base", "--double-quant"})
    config[config_key(flag)] = plain.at(config_key(flag));
  for (const char* key : {"init_checksum", "lora_rank_pattern", "lora_alpha_pattern"}) config.as_object().erase(key);
  ck.model_meta["castor.config"] = config.dump();
}

void record_lora_patterns(const TrainConfig& c, Json& config) {
  if (!c.lora_rank_pattern.empty()) config["lora_rank_pattern"] = pattern_json(c.lora_rank_pattern);
  if (!c.lora_alpha_pattern.empty()) config["lora_alpha_pattern"] = pattern_json(c.lora_alpha_pattern);
}

void take_lora_patterns(TrainConfig& c, const Json& recorded, const std::string& what) {
  if (const Json* p = recorded.find("lora_rank_pattern"))
    c.lora_rank_pattern = pattern_of<int64_t>(*p, what + ": lora_rank_pattern");
  if (const Json* p = recorded.find("lora_alpha_pattern"))
    c.lora_alpha_pattern = pattern_of<double>(*p, what + ": lora_alpha_pattern");
}

bool is_peft_file(const std::string& name) {
  return name == "adapter_config.json" || name == "adapter_model.safetensors";
}

void write_peft(const std::string& flag, const std::string& dir, const Checkpoint& ck, const std::string& what,
                const std::string& lora_base) {
  CASTOR_CHECK(is_lora_checkpoint(ck.model_meta), "--peft: ", what, " is not a LoRA run's (castor train --lora-rank)");
  auto model = adapted_model(ck, what, lora_base);
  // On a Hugging Face base, the names and q/k rotary rows PEFT uses on the Hugging Face model.
  const bool hf = formats::is_source(lora_base.empty() ? ck.model_meta.at(kBaseKey) : lora_base,
                                     formats::SourceFormat::HfDir);
  StateDict adapters = nn::lora_state_dict(*model);
  if (hf) adapters = formats::hf_adapters(dynamic_cast<models::Llama&>(*model).config(), adapters, /*to_castor=*/false);
  StateDict tensors;
  for (const auto& [k, t] : adapters) tensors.emplace(kPeftPrefix + k, t.to(DType::Float32).contiguous());
  const nn::LoraConfig c = run_lora_config(ck, what);
  const Json adapter_config = Json::Object{
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", lora_base.empty() ? ck.model_meta.at(kBaseKey) : absolute_path(lora_base)},
      {"r", c.r},
      {"lora_alpha", c.alpha},
      {"lora_dropout", c.dropout},
      {"target_modules", target_names(*model, hf)},
      {"use_rslora", c.rslora},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", Json()},
      {"layers_to_transform", Json()},
      {"revision", Json()}};
  // PEFT's rank_pattern and alpha_pattern, when the run has them, in their order (a Json object would sort them).
  std::string text = adapter_config.dump(2);
  const auto add_pattern = [&](const char* key, const auto& pattern) {
    if (pattern.empty()) return;
    std::string object;
    for (const auto& [k, v] : pattern) object += (object.empty() ? "{" : ", ") + Json(k).dump() + ": " + Json(v).dump();
    text.insert(text.rfind('}') - 1, detail::cat(",\n  ", Json(key).dump(), ": ", object, "}"));
  };
  add_pattern("rank_pattern", c.rank_pattern);
  add_pattern("alpha_pattern", c.alpha_pattern);
  write_output_dir(flag, dir, is_peft_file, "a PEFT export", {}, [&](const std::string& folder) {
    save_safetensors(folder + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
    atomic_write_file(folder + "/adapter_config.json", text + "\n");
  });
}

}  // namespace castor::train
