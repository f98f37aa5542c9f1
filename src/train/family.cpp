// The model-family table (train/family.h): GPT (nanoGPT's) and Llama (llama2.c's) rows.
#include "train/family.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "castor/checkpoint.h"
#include "castor/hf.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/tokenizer.h"
#include "castor/model_source.h"
#include "train/task.h"

namespace castor::train {

namespace fs = std::filesystem;

namespace {

// An error reading --init, as "--init FILE: ...".
Error init_error(const TrainConfig& c, const Error& e) {
  const std::string msg = e.what();
  return Error(msg.rfind(c.init, 0) == 0 ? "--init " + msg : detail::cat("--init ", c.init, ": ", msg));
}

// A size of --init's model: `flag` given with another value is an error naming both.
template <class T>
void take(const TrainConfig& c, const char* flag, T& field, T value) {
  CASTOR_CHECK(!c.given(flag) || field == value, flag, " ", field, ": --init ", c.init, " holds ", value);
  field = value;
}

// ---- gpt: nanoGPT's GPT ----

models::GPTConfig gpt_config_of(const TrainConfig& c, int64_t real_vocab) {
  models::GPTConfig g;
  g.n_layer = c.n_layer, g.n_head = c.n_head, g.n_embd = c.n_embd, g.block_size = c.block_size;
  g.vocab_size = c.vocab_size, g.real_vocab_size = real_vocab, g.dropout = c.dropout, g.bias = c.bias;
  return g;
}

void gpt_apply_sizes(TrainConfig& c) {
  const models::GPTConfig p = models::gpt_preset(name(c.model), 0);
  if (c.n_layer == 0) c.n_layer = p.n_layer;
  if (c.n_head == 0) c.n_head = p.n_head;
  if (c.n_embd == 0) c.n_embd = p.n_embd;
  if (c.block_size == 0) c.block_size = p.block_size;
  CASTOR_CHECK(c.n_embd % c.n_head == 0, "--n-embd ", c.n_embd, ": not a multiple of --n-head ", c.n_head);
}

void gpt_check(const TrainConfig&) {}  // (a GPT's sizes are all checked as the flags are applied)

// llm.c's gpt2_124M.bin (its header) or nanoGPT-named safetensors (read and checked whole, then dropped): the sizes;
// the weights load tensor by tensor into the model later (gpt_load), never beside a float32 copy.
void gpt_take_init_sizes(TrainConfig& c, const std::string&) {
  models::GPTConfig g;
  try {
    const int64_t n_head = c.given("--n-head") ? c.n_head : 0;
    if (formats::source_format(c.init) == formats::SourceFormat::Llmc) {
      g = formats::read_llmc_header(c.init).config;
      CASTOR_CHECK(n_head == 0 || n_head == g.n_head, c.init, ": llm.c header has NH ", g.n_head, ", but ", n_head,
                   " was given");
    } else {
      g = formats::load_gpt_init(c.init, n_head).config;
    }
  } catch (const Error& e) {
    throw init_error(c, e);
  }
  take(c, "--n-layer", c.n_layer, g.n_layer);
  take(c, "--n-head", c.n_head, g.n_head);
  take(c, "--n-embd", c.n_embd, g.n_embd);
  take(c, "--block-size", c.block_size, g.block_size);
  take(c, "--vocab-size", c.vocab_size, g.vocab_size);
  c.real_vocab_size = g.real_vocab_size;  // llm.c's header V; 0 for weights that record none
  CASTOR_CHECK(!c.given("--bias") || c.bias == g.bias, "--bias: --init ", c.init, g.bias ? " has" : " has no",
               " biases");
  c.bias = g.bias;
}

// (nanoGPT's names; the lm_head tied to wte)
void gpt_take_file_sizes(TrainConfig& c, StateDict& tensors, const Metadata& metadata, int64_t n_head, int64_t,
                         const std::string& path) {
  formats::GPTWeights w = formats::gpt_weights_from_safetensors(std::move(tensors), metadata, n_head, path);
  const models::GPTConfig& g = w.config;
  c.n_layer = g.n_layer, c.n_head = g.n_head, c.n_embd = g.n_embd, c.block_size = g.block_size;
  c.vocab_size = g.vocab_size, c.real_vocab_size = g.real_vocab_size, c.bias = g.bias;
  w.state["lm_head.weight"] = w.state.at("transformer.wte.weight");
  tensors = std::move(w.state);
}

// (the description's config when the run has one: the same model as the flags' for a run, and castor eval's window
// may be shorter than its context)
std::shared_ptr<models::LanguageModel> gpt_make(const TrainConfig& c, int64_t real_vocab, uint64_t seed) {
  models::GPTConfig g = c.model_config.is_object() ? gpt_config(c.model_config, "model_config") : gpt_config_of(c, 0);
  g.real_vocab_size = real_vocab;
  return models::gpt(g, seed);
}

Json gpt_describe(const TrainConfig& c) {
  return c.model_config.is_object() ? c.model_config : gpt_description(gpt_config_of(c, 0));
}

std::shared_ptr<models::LanguageModel> gpt_build(const Json& d, const std::string& what) {
  return models::gpt(gpt_config(d, what), /*seed=*/0);
}

// ---- llama: llama2.c's Llama ----

models::LlamaConfig llama_config_of(const TrainConfig& c) {
  models::LlamaConfig l;
  l.dim = c.n_embd, l.n_layers = c.n_layer, l.n_heads = c.n_head, l.n_kv_heads = c.n_kv_head;
  l.vocab_size = c.vocab_size, l.multiple_of = c.multiple_of, l.max_seq_len = c.block_size;
  l.rope_theta = c.rope_theta, l.tied = !c.untied, l.dropout = c.dropout;
  return l;
}

// The preset's sizes where not given (key/value heads: the preset's, or --n-head's when that is given), and
// LlamaConfig::validate's checks naming the flags.
void llama_apply_sizes(TrainConfig& c) {
  const models::LlamaConfig p = models::llama_preset(name(c.model), 0);
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head == 0 ? p.kv_heads() : c.n_head;
  if (c.n_layer == 0) c.n_layer = p.n_layers;
  if (c.n_head == 0) c.n_head = p.n_heads;
  if (c.n_embd == 0) c.n_embd = p.dim;
  if (c.block_size == 0) c.block_size = p.max_seq_len;
  if (c.multiple_of == 0) c.multiple_of = p.multiple_of;
  CASTOR_CHECK(c.n_embd % c.n_head == 0, "--n-embd ", c.n_embd, ": not a multiple of --n-head ", c.n_head);
  CASTOR_CHECK((c.n_embd / c.n_head) % 2 == 0, "--n-embd ", c.n_embd, " / --n-head ", c.n_head, ": the head size ",
               c.n_embd / c.n_head, " is odd (rotary embeddings rotate pairs of it)");
  CASTOR_CHECK(c.n_head % c.n_kv_head == 0, "--n-kv-head ", c.n_kv_head, ": --n-head ", c.n_head,
               " is not a multiple of it (each key/value head serves a group of query heads)");
}

// (the description's config when the run has one: the same model as the flags' for a run of Castor's sizes)
models::LlamaConfig llama_model_config(const TrainConfig& c) {
  return c.model_config.is_object() ? llama_config(c.model_config, "model_config") : llama_config_of(c);
}

void llama_check(const TrainConfig& c) { llama_model_config(c).validate(); }

// A llama2.c file's header (its feed-forward width as --multiple-of, its classifier as --untied), or the settings a
// Castor Llama's safetensors record (a run's checkpoint, a file castor export --safetensors wrote); its vocabulary
// must be the token directory's. Other safetensors keep the flags' sizes (their tensors' shapes are checked as they
// load).
// Another tool's model that describes itself (a Hugging Face directory's config.json, a GGUF file's metadata):
// its description (its norm eps and feed-forward width have no flags); the model runs --block-size positions (at most
// the file's context), and the token directory's vocabulary fits in its embedding. Not given, --block-size is its
// context up to formats::kDefaultWindow (2048; the description keeps max_position_embeddings, which exports write).
void llama_take_described_sizes(TrainConfig& c, const std::string& data_dir) {
  Json description;
  models::LlamaConfig l;
  try {
    description = formats::source_description(c.init);
    l = llama_config(description, c.init);
  } catch (const Error& e) {
    throw init_error(c, e);
  }
  take(c, "--n-layer", c.n_layer, l.n_layers);
  take(c, "--n-head", c.n_head, l.n_heads);
  take(c, "--n-kv-head", c.n_kv_head, l.kv_heads());
  take(c, "--n-embd", c.n_embd, l.dim);
  take(c, "--vocab-size", c.vocab_size, l.vocab_size);
  take(c, "--rope-theta", c.rope_theta, l.rope_theta);
  CASTOR_CHECK(!c.given("--block-size") || c.block_size <= l.max_seq_len, "--block-size ", c.block_size, ": --init ",
               c.init, " runs at most ", l.max_seq_len, " positions");
  if (!c.given("--block-size")) c.block_size = std::min(l.max_seq_len, formats::kDefaultWindow);
  CASTOR_CHECK(!c.given("--untied") || c.untied != l.tied, "--untied: --init ", c.init, "'s lm_head ",
               l.tied ? "is" : "is not", " tied to the embedding (tie_word_embeddings)");
  c.untied = !l.tied;
  CASTOR_CHECK(!c.given("--multiple-of"), "--multiple-of: --init ", c.init, " gives intermediate_size ", l.hidden_dim);
  c.multiple_of = l.hidden_dim;  // (model.py's rule gives it from itself whenever it is at least 8/3 dim)
  l.max_seq_len = c.block_size, l.dropout = c.dropout;
  const std::string record = data::token_record_path(data_dir);
  const int64_t tokens = !record.empty() ? data::Tokenizer::recorded_vocab_size(data_dir) : 0;
  CASTOR_CHECK(tokens <= l.vocab_size, "--init ", c.init, ": vocab_size ", l.vocab_size, ", but ", record,
               "'s vocabulary has ", tokens, " tokens (more than the embedding's rows)");
  Json d = llama_description(l);
  for (const char* key : {"architecture", "bos_token_id", "eos_token_id", "max_position_embeddings"})
    if (const Json* v = description.find(key)) d[key] = *v;
  c.model_config = d;
}

void llama_take_init_sizes(TrainConfig& c, const std::string& data_dir) {
  const formats::SourceFormat source = formats::source_format(c.init);
  if (source == formats::SourceFormat::HfDir || source == formats::SourceFormat::Gguf)
    return llama_take_described_sizes(c, data_dir);
  formats::Llama2cConfig f;
  bool shared_classifier = true;
  int64_t multiple_of = 0;
  try {
    if (source == formats::SourceFormat::Llama2c) {
      const formats::Llama2cHeader h = formats::read_llama2c_header(c.init);
      f = h.config, shared_classifier = h.shared_classifier;
      multiple_of = formats::llama2c_multiple_of(f, c.init);
    } else {
      const Json recorded = source == formats::SourceFormat::Safetensors
                                ? castor_config(read_safetensors_header(c.init).metadata, c.init)
                                : Json();
      const Json* model = recorded.is_object() ? recorded.find("model") : nullptr;
      if (!model || !model->is_string() || !model->as_string().starts_with("llama")) return;
      const TrainConfig r = resume_config(TrainConfig{}, recorded, c.init);
      const models::LlamaConfig l = llama_config_of(r);
      f = formats::llama2c_config(l, c.init), shared_classifier = l.tied, multiple_of = l.multiple_of;
    }
  } catch (const Error& e) {
    throw init_error(c, e);
  }
  take(c, "--n-layer", c.n_layer, f.n_layers);
  take(c, "--n-head", c.n_head, f.n_heads);
  take(c, "--n-kv-head", c.n_kv_head, f.n_kv_heads);
  take(c, "--n-embd", c.n_embd, f.dim);
  take(c, "--block-size", c.block_size, f.max_seq_len);
  take(c, "--vocab-size", c.vocab_size, f.vocab_size);
  take(c, "--rope-theta", c.rope_theta, f.rope_theta);
  CASTOR_CHECK(!c.given("--untied") || c.untied != shared_classifier, "--untied: --init ", c.init, "'s output ",
               shared_classifier ? "shares" : "does not share", " tok_embeddings' weight");
  c.untied = !shared_classifier;
  models::LlamaConfig given;
  given.dim = f.dim, given.multiple_of = c.multiple_of;
  CASTOR_CHECK(!c.given("--multiple-of") || given.ffn_hidden_dim() == f.hidden_dim, "--multiple-of ", c.multiple_of,
               ": gives hidden_dim ", given.ffn_hidden_dim(), ", --init ", c.init, " holds ", f.hidden_dim);
  if (!c.given("--multiple-of")) c.multiple_of = multiple_of;
  const std::string record = data::token_record_path(data_dir);
  const int64_t tokens = !record.empty() ? data::Tokenizer::recorded_vocab_size(data_dir) : 0;
  CASTOR_CHECK(tokens == 0 || tokens == f.vocab_size, "--init ", c.init, ": vocab_size ", f.vocab_size, ", but ",
               record, "'s vocabulary has ", tokens, " tokens");
}

// (llama2.c's and Castor's names; the output tied unless output.weight holds other values)
void llama_take_file_sizes(TrainConfig& c, StateDict& tensors, const Metadata&, int64_t n_head, int64_t context,
                           const std::string& path) {
  auto need = [&](const std::string& name) -> const Tensor& {
    auto it = tensors.find(name);
    CASTOR_CHECK(it != tensors.end() && it->second.dim() == 2, path, ": no 2-D tensor ", name,
                 " (expected a Llama's names: tok_embeddings, layers.N.attention.wq, ...)");
    return it->second;
  };
  const Tensor& embeddings = need("tok_embeddings.weight");  // (V, dim)
  c.vocab_size = embeddings.size(0), c.n_embd = embeddings.size(1);
  c.n_layer = 0;
  while (tensors.count(detail::cat("layers.", c.n_layer, ".attention_norm.weight"))) ++c.n_layer;
  CASTOR_CHECK(c.n_layer > 0, path, ": no tensor layers.0.attention_norm.weight (expected a Llama's names)");
  CASTOR_CHECK(n_head > 0, path, ": the number of heads is not recorded in the file; give it (--n-head)");
  CASTOR_CHECK(context > 0, path, ": a Llama's context length is not recorded in the file; give it (--block-size)");
  CASTOR_CHECK(c.n_embd % n_head == 0, "--n-head ", n_head, ": does not divide ", path, "'s dim ", c.n_embd);
  c.n_head = n_head, c.block_size = context;
  c.n_kv_head = need("layers.0.attention.wk.weight").size(0) / (c.n_embd / n_head);  // (Hkv D, dim)
  formats::Llama2cConfig sizes;
  sizes.dim = c.n_embd, sizes.hidden_dim = need("layers.0.feed_forward.w1.weight").size(0);  // (hidden, dim)
  c.multiple_of = formats::llama2c_multiple_of(sizes, path);
  // (a file may store the shared tensor twice)
  const auto output = tensors.find("output.weight");
  if (output != tensors.end()) {
    const Tensor a = output->second.to(DType::Float32).contiguous(), b = embeddings.to(DType::Float32).contiguous();
    c.untied = a.shape() != b.shape() || std::memcmp(a.data_ptr(), b.data_ptr(), b.nbytes()) != 0;
  }
  if (!c.untied) tensors["output.weight"] = embeddings;
}

std::shared_ptr<models::LanguageModel> llama_make(const TrainConfig& c, int64_t, uint64_t seed) {
  return models::llama(llama_model_config(c), seed);
}

Json llama_describe(const TrainConfig& c) {
  return c.model_config.is_object() ? c.model_config : llama_description(llama_config_of(c));
}

std::shared_ptr<models::LanguageModel> llama_build(const Json& d, const std::string& what) {
  return models::llama(llama_config(d, what), /*seed=*/0);
}

}  // namespace

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"gpt",
       "GPT",
       {ModelKind::Gpt, ModelKind::GptMini, ModelKind::Gpt2},
       Job::Gpt,
       "LayerNorm, learned positions, GELU MLP, optional biases, output tied to the embedding",
       Dataset::BrownChar,
       1e-3,
       100,
       2000,
       true,
       gpt_apply_sizes,
       gpt_check,
       gpt_take_init_sizes,
       gpt_take_file_sizes,
       gpt_make,
       gpt_describe,
       gpt_build},
      {"llama",
       "Llama",
       {ModelKind::Llama, ModelKind::Llama260k, ModelKind::Llama15m},
       Job::Llama,
       "RMSNorm, rotary embeddings on interleaved pairs, grouped-query attention, SwiGLU, output tied or untied; "
       "from Hugging Face directories (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM: formats/hf.cpp's "
       "architecture rows) a head_dim, q/k/v/o and MLP biases, linear and llama3 rope scaling, a sliding window",
       Dataset::BrownBpe,
       2e-3,
       50,
       500,
       false,
       llama_apply_sizes,
       llama_check,
       llama_take_init_sizes,
       llama_take_file_sizes,
       llama_make,
       llama_describe,
       llama_build},
  };
  return table;
}

const Family* family_of(ModelKind m) {
  for (const Family& f : families())
    for (ModelKind p : f.presets)
      if (p == m) return &f;
  return nullptr;
}

const Family* family_named(const std::string& name) {
  for (const Family& f : families())
    if (name == f.name) return &f;
  return nullptr;
}

const Family* family_of_spelling(const std::string& model) {
  for (const Spelling<ModelKind>& s : kModels)
    if (model == s.name) return family_of(s.value);
  return nullptr;
}

const Family& family(const TrainConfig& c) {
  const Family* f = family_of(c.model);
  CASTOR_CHECK(f, "--model ", name(c.model), ": not a language model");
  return *f;
}

Json model_description(const Json& recorded, const std::string& what) {
  if (const Json* d = recorded.is_object() ? recorded.find("model_config") : nullptr; d && d->is_object()) return *d;
  const TrainConfig c = resume_config(TrainConfig{}, recorded, what);
  const Family* f = family_of(c.model);
  return f ? f->describe(c) : Json();
}

}  // namespace castor::train
