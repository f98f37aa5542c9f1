// Reading GGUF v3 files (castor/gguf.h): the header checked field by field, a llama or qwen2 model's description and
// tensors under Castor's names, and the tokenizer its metadata holds.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <set>

#include "castor/check.h"
#include "castor/formats.h"
#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/hf.h"
#include "castor/hf_tokenizer.h"
#include "castor/quant.h"
#include "ops/transformer.h"

namespace castor::formats {

using models::Llama;
using models::LlamaConfig;

namespace {

// The architectures read, and how their keys are named.
struct Arch {
  std::string name, hf;
  bool qwen2;
};
Arch arch_of(const GgufHeader& h, const std::string& path) {
  const Json* a = h.find("general.architecture");
  CASTOR_CHECK(a && a->is_string(), path, ": no general.architecture");
  if (a->as_string() == "llama") return {"llama", "LlamaForCausalLM", false};
  if (a->as_string() == "qwen2") return {"qwen2", "Qwen2ForCausalLM", true};
  throw Error(detail::cat(path, ": general.architecture ", printable(a->as_string()),
                          " is not read (llama, which Mistral's files use too, and qwen2)"));
}

int64_t need_int(const GgufHeader& h, const std::string& key, const std::string& path) {
  const Json* v = h.find(key);
  CASTOR_CHECK(v && v->is_int() && v->as_int() > 0 && v->as_int() < (int64_t(1) << 31), path, ": ", key,
               v ? " is not a positive 32-bit integer" : " is missing");
  return v->as_int();
}
double number_or(const GgufHeader& h, const std::string& key, double fallback, const std::string& path) {
  const Json* v = h.find(key);
  if (!v) return fallback;
  CASTOR_CHECK(v->is_number(), path, ": ", key, " is not a number");
  return v->as_double();
}

const GgufTensorInfo* tensor_named(const GgufHeader& h, const std::string& name) {
  for (const GgufTensorInfo& t : h.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// Llama 3.1's rope scaling from the per-pair factors llama.cpp divides each pair's angle by (rope_freqs.weight, which
// convert_hf_to_gguf.py writes instead of a rope scaling key): the llama3 scaling of Meta's low_freq_factor 1 and
// high_freq_factor 4 whose factors they are, its factor the largest and original_max_position_embeddings solved from
// a smoothed pair (or, with none, between the wavelengths kept and divided); castor::Error naming the tensor when no
// such scaling gives the table (each inverse frequency within 1e-5 of the file's).
F::RopeScaling llama3_from_rope_freqs(const GgufHeader& h, const LlamaConfig& l, const std::string& path) {
  const GgufTensorInfo* t = tensor_named(h, kGgufRopeFreqs);
  const int64_t half = l.head_size() / 2;
  CASTOR_CHECK(t->type == 0 && t->ne.size() == 1 && t->ne[0] == static_cast<uint64_t>(half), path,
               ": tensor rope_freqs.weight is not f32 [", half, "] (one factor per rotary pair)");
  uint64_t size = 0;
  const std::vector<uint8_t> bytes = read_file_range(path, t->begin, t->bytes, size);
  std::vector<float> f(static_cast<size_t>(half));
  std::memcpy(f.data(), bytes.data(), bytes.size());
  const std::vector<float> inv = rotary_inv_freq(l.head_size(), l.rope_theta);
  F::RopeScaling r;
  r.factor = *std::max_element(f.begin(), f.end());
  if (r.factor == 1.0f && *std::min_element(f.begin(), f.end()) == 1.0f) return {};  // (every pair as it is)
  r.type = F::RopeScaling::Type::Llama3;
  double lo = 0, hi = 0;  // the longest wavelength kept, the shortest divided by the factor
  bool solved = false;
  for (int64_t k = 0; k < half; ++k) {
    const double wavelen = 2 * M_PI / inv[k], fk = f[k];
    if (fk <= 1 + 1e-6)
      lo = std::max(lo, wavelen);
    else if (fk >= r.factor * (1 - 1e-6))
      hi = hi == 0 ? wavelen : std::min(hi, wavelen);
    else if (!solved) {  // (smooth = (orig / wavelen - 1) / 3)
      const double smooth = (1 / fk - 1 / r.factor) / (1 - 1 / r.factor);
      r.original_max_position_embeddings = std::llround((3 * smooth + 1) * wavelen);
      solved = true;
    }
  }
  if (!solved && lo > 0 && hi > 4 * lo)
    r.original_max_position_embeddings = std::llround(std::sqrt(4 * lo * hi));  // (none smoothed: any between)
  bool same = r.factor > 1;
  if (same) {
    const std::vector<float> want = rotary_inv_freq(l.head_size(), l.rope_theta, r);
    for (int64_t k = 0; k < half; ++k) same = same && std::abs(inv[k] / f[k] - want[k]) <= 1e-5 * want[k];
  }
  CASTOR_CHECK(same, path, ": tensor rope_freqs.weight: per-pair rope factors that no llama3 rope scaling (low and ",
               "high frequency factors 1 and 4) gives, which Castor does not compute");
  return r;
}

LlamaConfig gguf_llama_config(const GgufHeader& h, const std::string& path) {
  const Arch a = arch_of(h, path);
  const auto key = [&](const char* k) { return a.name + "." + k; };
  // Keys whose values change the math in ways Castor's Llama does not compute.
  for (const char* k :
       {"expert_count", "expert_used_count", "attention.sliding_window", "attn_logit_softcapping",
        "final_logit_softcapping", "logit_scale", "embedding_scale", "residual_scale", "attention.scale",
        "attention.clamp_kqv", "attention.layer_norm_epsilon", "rope.scaling.attn_factor"})
    if (const Json* v = h.find(key(k)))
      CASTOR_CHECK(v->is_number() && v->as_double() == (std::string(k) == "rope.scaling.attn_factor" ? 1.0 : 0.0), path,
                   ": ", key(k), " = ", v->dump(), " changes the model's math in a way Castor does not compute");
  LlamaConfig l;
  l.dim = need_int(h, key("embedding_length"), path);
  l.n_layers = need_int(h, key("block_count"), path);
  l.n_heads = need_int(h, key("attention.head_count"), path);
  l.n_kv_heads = h.find(key("attention.head_count_kv")) ? need_int(h, key("attention.head_count_kv"), path) : l.n_heads;
  l.hidden_dim = need_int(h, key("feed_forward_length"), path);
  l.max_seq_len = need_int(h, key("context_length"), path);
  l.norm_eps = number_or(h, key("attention.layer_norm_rms_epsilon"), 1e-5, path);
  l.rope_theta = number_or(h, key("rope.freq_base"), 10000.0, path);
  if (h.find(key("attention.key_length"))) {
    l.head_dim = need_int(h, key("attention.key_length"), path);
    CASTOR_CHECK(!h.find(key("attention.value_length")) ||
                     need_int(h, key("attention.value_length"), path) == l.head_dim,
                 path, ": ", key("attention.value_length"), " differs from ", key("attention.key_length"));
  }
  const int64_t head = l.head_dim > 0 ? l.head_dim : l.dim / l.n_heads;
  if (h.find(key("rope.dimension_count")))
    CASTOR_CHECK(need_int(h, key("rope.dimension_count"), path) == head, path, ": ", key("rope.dimension_count"), " ",
                 h.find(key("rope.dimension_count"))->dump(), ": a partial rotary (the head size is ", head,
                 "), which Castor does not compute");
  if (const Json* s = h.find(key("rope.scaling.type"))) {
    CASTOR_CHECK(s->is_string() && (s->as_string() == "none" || s->as_string() == "linear"), path, ": ",
                 key("rope.scaling.type"), " ", s->dump(), " is not computed (none and linear are)");
    if (s->as_string() == "linear") {
      l.rope_scaling.type = F::RopeScaling::Type::Linear;
      l.rope_scaling.factor = number_or(h, key("rope.scaling.factor"), 1.0, path);
    }
  }
  if (tensor_named(h, kGgufRopeFreqs)) {
    CASTOR_CHECK(!a.qwen2 && l.rope_scaling.type == F::RopeScaling::Type::None, path,
                 ": tensor rope_freqs.weight (per-pair rope factors) with ",
                 a.qwen2 ? "arch qwen2" : "a rope scaling key", ", which Castor does not compute");
    l.rope_scaling = llama3_from_rope_freqs(h, l, path);
  }
  const GgufTensorInfo* embd = tensor_named(h, "token_embd.weight");
  CASTOR_CHECK(embd && embd->ne.size() == 2 && static_cast<int64_t>(embd->ne[0]) == l.dim, path,
               ": no tensor token_embd.weight of [", l.dim, ", vocabulary]");
  l.vocab_size = static_cast<int64_t>(embd->ne[1]);
  l.tied = !tensor_named(h, "output.weight");
  // Biases as the writer writes them: q/k/v's alone (qwen2's), q/k/v/o's, the MLP's.
  l.attention_bias = tensor_named(h, "blk.0.attn_output.bias") != nullptr;
  l.qkv_bias = !l.attention_bias && tensor_named(h, "blk.0.attn_q.bias") != nullptr;
  l.mlp_bias = tensor_named(h, "blk.0.ffn_gate.bias") != nullptr;
  CASTOR_CHECK(!a.qwen2 || (l.qkv_bias && !l.mlp_bias), path,
               ": arch qwen2 with biases other than q/k/v's alone (blk.0.attn_q.bias ... attn_v.bias)");
  try {
    l.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
  return l;
}

}  // namespace

Json gguf_description(const GgufHeader& h, const std::string& path) {
  Json d = formats::llama_description(gguf_llama_config(h, path));
  d["architecture"] = arch_of(h, path).hf;
  const Json* bos = h.find("tokenizer.ggml.bos_token_id");
  const Json* eos = h.find("tokenizer.ggml.eos_token_id");
  d["bos_token_id"] = bos ? *bos : Json();
  d["eos_token_id"] = eos ? *eos : Json();
  d["max_position_embeddings"] = d.at("max_seq_len");
  return d;
}

std::string gguf_quantized_note(const GgufHeader& h) {
  std::map<std::string, int64_t> counts;
  for (const GgufTensorInfo& t : h.tensors)
    if (t.type != 0 && t.type != 1 && t.type != 30) ++counts[ggml_type_name(t.type)];
  if (counts.empty()) return "";
  std::string types;
  for (const auto& [name, n] : counts) types += detail::cat(types.empty() ? "" : ", ", name, " (", n, " tensors)");
  return types +
         ": a LoRA run (--lora-rank), castor sample and castor eval keep a Linear's weight in these blocks; "
         "full fine-tuning dequantizes them to float32 trainable weights";
}

Metadata gguf_metadata(const GgufHeader& h, const std::string& path, const std::string& data) {
  const Json settings = formats::llama_settings(gguf_llama_config(h, path), gguf_description(h, path), data);
  Metadata m = {
      {"castor.config", settings.dump()}, {"castor.model", "llama"}, {"gguf.architecture", arch_of(h, path).name}};
  if (const std::string note = gguf_quantized_note(h); !note.empty()) m["gguf.quantized"] = note;
  return m;
}

namespace {

// A file tensor's Castor name and shape, checked against the description's model.
struct Planned {
  std::string name;
  Shape shape;
  DType dtype;
};
Planned plan(const GgufTensorInfo& t, const std::string& path) {
  const std::string name = castor_name(gguf_llama_layout(), t.name);
  CASTOR_CHECK(!name.empty(), path, ": tensor ", printable(t.name), " is not one of a llama or qwen2 model's");
  Shape shape;
  for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) shape.push_back(static_cast<int64_t>(*it));
  const DType dtype = t.type == 1 ? DType::Float16 : t.type == 30 ? DType::BFloat16 : DType::Float32;
  return {name, shape, dtype};
}

}  // namespace

SafetensorsFile gguf_listing(const GgufHeader& h, const std::string& path) {
  SafetensorsFile f;
  for (const GgufTensorInfo& t : h.tensors) {
    if (t.name == kGgufRopeFreqs) continue;  // (the description's rope scaling)
    const Planned p = plan(t, path);
    f.entries.push_back({p.name, p.dtype, p.shape, t.begin, t.begin + t.bytes});
  }
  f.metadata = gguf_metadata(h, path, "");
  return f;
}

namespace {

bool is_dense_type(uint32_t type) { return type == 0 || type == 1 || type == 30; }  // f32, f16, bf16

// A tensor's values as its dtype (f32, f16, bf16 as stored; a quantized type's blocks dequantized to float32).
Tensor read_values(const std::string& path, const GgufTensorInfo& t, const Planned& p, uint64_t size) {
  if (is_dense_type(t.type)) {
    Tensor x = empty(p.shape, p.dtype);
    read_file_range_into(path, t.begin, std::span<uint8_t>(static_cast<uint8_t*>(x.data_ptr()), x.nbytes()), size);
    return x;
  }
  const std::vector<uint8_t> blocks = read_file_range(path, t.begin, t.bytes, size);
  Tensor x = empty(p.shape, DType::Float32);
  quant::block_type(static_cast<quant::BlockType>(t.type)).dequantize(blocks.data(), x.data<float>(), x.numel());
  return x;
}

// A matrix's blocks as they are stored: (rows, cols) with each row whole blocks of its type.
std::shared_ptr<quant::QuantizedMatrix> read_blocks(const std::string& path, const GgufTensorInfo& t, const Planned& p,
                                                    uint64_t size) {
  auto q = std::make_shared<quant::QuantizedMatrix>();
  q->type = static_cast<quant::BlockType>(t.type);
  q->rows = p.shape[0], q->cols = p.shape[1];
  q->data = empty({q->rows, quant::row_bytes(q->type, q->cols)}, DType::UInt8);
  read_file_range_into(path, t.begin, std::span<uint8_t>(q->data.data<uint8_t>(), q->data.nbytes()), size);
  return q;
}

}  // namespace

void read_gguf_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take,
                    const BlocksTake& blocks) {
  const GgufHeader h = read_gguf_header(path);
  const LlamaConfig l = gguf_llama_config(h, path);
  const bool qwen2 = arch_of(h, path).qwen2;
  std::vector<Planned> planned;
  for (const GgufTensorInfo& t : h.tensors)
    if (t.name != kGgufRopeFreqs) planned.push_back(plan(t, path));
  uint64_t size = 0;
  read_file_range(path, 0, 0, size);
  size_t i = 0;
  for (const GgufTensorInfo& t : h.tensors) {
    if (t.name == kGgufRopeFreqs) continue;
    const Planned& p = planned[i++];
    // qwen2 keeps Hugging Face's rotate-half rows in wq and wk (and their biases): Castor's are interleaved (whole
    // rows move, so a matrix's rows of blocks move as they are).
    const bool q = p.name.find(".wq.") != std::string::npos, k = p.name.find(".wk.") != std::string::npos;
    const auto rows_in_castor_order = [&](const Tensor& x) {
      return qwen2 && (q || k) ? formats::permute_rows(x, q ? l.n_heads : l.kv_heads(), /*to_castor=*/true) : x;
    };
    if (!is_dense_type(t.type) && p.shape.size() == 2 && blocks.wants && blocks.wants(p.name)) {
      const std::shared_ptr<quant::QuantizedMatrix> m = read_blocks(path, t, p, size);
      m->data = rows_in_castor_order(m->data).contiguous();
      blocks.take(p.name, m);
      continue;
    }
    take(p.name, rows_in_castor_order(read_values(path, t, p, size)));
  }
}

namespace {

// A file's tokenizer.ggml.* keys, checked: the model, the tokens and their types, the special ids.
struct VocabKeys {
  const GgufHeader& h;
  const std::string& path;
  std::string model, pre;
  const Json::Array* tokens = nullptr;
  const Json::Array* types = nullptr;  // null: every token normal
  int64_t n = 0, bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
  bool add_bos = false;

  std::string text(const char* key) const {
    const Json* v = h.find(key);
    return v && v->is_string() ? v->as_string() : "";
  }
  // An array of one entry per token, or null when the key is missing.
  const Json::Array* per_token(const char* key) const {
    const Json* v = h.find(key);
    if (!v) return nullptr;
    CASTOR_CHECK(v->is_array() && static_cast<int64_t>(v->as_array().size()) == n, path, ": ", key,
                 " is not an array of ", n, " (one per token)");
    return &v->as_array();
  }
  int64_t id_key(const char* key) const {
    const Json* v = h.find(key);
    if (!v) return -1;
    CASTOR_CHECK(v->is_int() && v->as_int() >= 0 && v->as_int() < n, path, ": ", key, " ", v->dump(),
                 " is not a token id below ", n);
    return v->as_int();
  }
  int64_t type_of(int64_t id) const { return types ? (*types)[id].as_int() : 1; }
  const std::string& token(int64_t id) const { return (*tokens)[id].as_string(); }
};

VocabKeys vocab_keys(const GgufHeader& h, const std::string& path) {
  VocabKeys k{h, path};
  k.model = k.text("tokenizer.ggml.model"), k.pre = k.text("tokenizer.ggml.pre");
  CASTOR_CHECK(k.model == "gpt2" || k.model == "llama", path, ": tokenizer.ggml.model ", printable(k.model),
               k.model.empty() ? "(none)" : "", " is not read (gpt2: byte-level BPE, llama: SentencePiece)");
  const Json* tokens = h.find("tokenizer.ggml.tokens");
  CASTOR_CHECK(tokens && tokens->is_array() && !tokens->as_array().empty(), path,
               ": tokenizer.ggml.tokens is missing or not an array");
  k.tokens = &tokens->as_array();
  k.n = static_cast<int64_t>(k.tokens->size());
  for (int64_t id = 0; id < k.n; ++id)
    CASTOR_CHECK((*k.tokens)[id].is_string(), path, ": tokenizer.ggml.tokens[", id, "] is not a string");
  k.types = k.per_token("tokenizer.ggml.token_type");
  k.bos = k.id_key("tokenizer.ggml.bos_token_id"), k.eos = k.id_key("tokenizer.ggml.eos_token_id");
  k.eot = k.id_key("tokenizer.ggml.eot_token_id"), k.unk = k.id_key("tokenizer.ggml.unknown_token_id");
  k.pad = k.id_key("tokenizer.ggml.padding_token_id");
  const Json* add_bos = h.find("tokenizer.ggml.add_bos_token");
  k.add_bos = add_bos ? add_bos->is_bool() && add_bos->as_bool() : k.model == "llama";
  return k;
}

// The token -> id map, and the control and user-defined tokens as added tokens (matched in the raw text).
std::pair<Json::Object, Json::Array> vocab_and_added(const VocabKeys& k) {
  Json::Object vocab;
  Json::Array added;
  for (int64_t id = 0; id < k.n; ++id) {
    const std::string& t = k.token(id);
    const int64_t type = k.type_of(id);
    if (type == 3 || type == 4)  // control and user-defined
      added.push_back(Json::Object{{"id", id},
                                   {"content", t},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", type == 3}});
    CASTOR_CHECK(vocab.emplace(t, id).second || type == 5, k.path, ": tokenizer.ggml.tokens[", id, "] '", printable(t),
                 "' appears twice");
  }
  return {std::move(vocab), std::move(added)};
}

// add_bos_token as a template putting the BOS token first.
Json bos_template(const VocabKeys& k) {
  const std::string b = k.token(k.bos);
  const auto special = Json::Object{{"SpecialToken", Json::Object{{"id", b}, {"type_id", 0}}}};
  const auto sequence = [](const char* id, int type) {
    return Json::Object{{"Sequence", Json::Object{{"id", id}, {"type_id", type}}}};
  };
  return Json::Object{
      {"type", "TemplateProcessing"},
      {"single", Json::Array{special, sequence("A", 0)}},
      {"pair", Json::Array{special, sequence("A", 0), sequence("B", 1)}},
      {"special_tokens",
       Json::Object{{b, Json::Object{{"id", b}, {"ids", Json::Array{k.bos}}, {"tokens", Json::Array{b}}}}}}};
}

Json bpe_model(Json::Object vocab, Json::Array merges, bool spm, bool ignore_merges, Json unk) {
  return Json::Object{{"type", "BPE"},
                      {"dropout", Json()},
                      {"unk_token", std::move(unk)},
                      {"continuing_subword_prefix", Json()},
                      {"end_of_word_suffix", Json()},
                      {"fuse_unk", spm},
                      {"byte_fallback", spm},
                      {"ignore_merges", ignore_merges},
                      {"vocab", std::move(vocab)},
                      {"merges", std::move(merges)}};
}

// "gpt2": byte-level BPE with the file's merges, its pre-tokenizer named by tokenizer.ggml.pre.
void byte_level_tokenizer(const VocabKeys& k, Json::Object vocab, Json& tj) {
  const Json* m = k.h.find("tokenizer.ggml.merges");
  CASTOR_CHECK(m && m->is_array(), k.path, ": tokenizer.ggml.merges is missing (byte-level BPE needs it)");
  Json::Array merges;
  for (const Json& s : m->as_array()) {
    CASTOR_CHECK(s.is_string() && s.as_string().find(' ') != std::string::npos, k.path,
                 ": tokenizer.ggml.merges holds ", s.dump().substr(0, 40), ", not \"a b\"");
    merges.push_back(s);
  }
  const Json byte_level = Json::Object{
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const std::string& pre = k.pre;
  Json pre_tokenizer;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
    const std::string regex(data::hf_split_regex(pre == "qwen2" ? 1 : 3));
    const Json split = Json::Object{
        {"type", "Split"}, {"pattern", Json::Object{{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
    pre_tokenizer = Json::Object{{"type", "Sequence"}, {"pretokenizers", Json::Array{split, byte_level}}};
  } else if (pre == "gpt-2" || pre == "default" || pre.empty()) {
    pre_tokenizer = byte_level;
    pre_tokenizer["use_regex"] = true;
  } else {
    throw Error(detail::cat(k.path, ": tokenizer.ggml.pre ", printable(pre),
                            " is not read (llama-bpe, qwen2, gpt-2 and default are)"));
  }
  tj["normalizer"] = pre == "qwen2" ? Json(Json::Object{{"type", "NFC"}}) : Json();
  tj["pre_tokenizer"] = pre_tokenizer;
  tj["post_processor"] = k.add_bos && k.bos >= 0 ? bos_template(k) : byte_level;
  tj["decoder"] = byte_level;
  tj["model"] = bpe_model(std::move(vocab), std::move(merges), /*spm=*/false,
                          /*ignore_merges=*/pre == "llama-bpe" || pre == "llama3", Json());
}

// Every split of a normal token into two normal tokens as a merge, ranked by the merged token's score (highest first),
// then the left part's length: Hugging Face's reading of a SentencePiece vocabulary (transformers' converter), for
// the tools that read tokenizer.json; Castor merges by the scores themselves (model.gguf_scores), as llama.cpp does.
Json::Array spm_merges(const VocabKeys& k, const Json::Object& vocab, const Json::Array& scores) {
  struct Merge {
    double score;
    int64_t id;
    size_t cut;
  };
  std::vector<Merge> all;
  for (int64_t id = 0; id < k.n; ++id) {
    if (k.type_of(id) != 1) continue;
    const std::string& t = k.token(id);
    for (size_t cut = 1; cut < t.size(); ++cut) {
      if ((static_cast<uint8_t>(t[cut]) & 0xC0) == 0x80) continue;  // (inside a UTF-8 character)
      const auto l = vocab.find(t.substr(0, cut)), r = vocab.find(t.substr(cut));
      if (l != vocab.end() && r != vocab.end() && k.type_of(l->second.as_int()) == 1 &&
          k.type_of(r->second.as_int()) == 1)
        all.push_back({scores[id].as_double(), id, cut});
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  Json::Array merges;
  for (const Merge& m : all) merges.push_back(Json::Array{k.token(m.id).substr(0, m.cut), k.token(m.id).substr(m.cut)});
  return merges;
}

// "llama": SentencePiece as BPE with byte fallback over U+2581 for spaces (a dummy prefix unless add_space_prefix is
// false), the scores kept for llama.cpp's merging.
void sentencepiece_tokenizer(const VocabKeys& k, Json::Object vocab, Json& tj) {
  const Json::Array* scores = k.per_token("tokenizer.ggml.scores");
  CASTOR_CHECK(scores, k.path, ": tokenizer.ggml.scores is missing (a SentencePiece tokenizer needs it)");
  for (const Json& s : *scores) CASTOR_CHECK(s.is_number(), k.path, ": tokenizer.ggml.scores holds ", s.dump());
  Json::Array merges = spm_merges(k, vocab, *scores);
  const Json* prefix_key = k.h.find("tokenizer.ggml.add_space_prefix");
  const bool prefix = !prefix_key || (prefix_key->is_bool() && prefix_key->as_bool());
  const std::string metaspace = "\xE2\x96\x81";
  const Json replace = Json::Object{
      {"type", "Replace"}, {"pattern", Json::Object{{"String", " "}}}, {"content", metaspace}};
  const Json prepend = Json::Object{{"type", "Prepend"}, {"prepend", metaspace}};
  tj["normalizer"] = prefix ? Json(Json::Object{{"type", "Sequence"}, {"normalizers", Json::Array{prepend, replace}}})
                            : replace;
  tj["pre_tokenizer"] = Json();
  tj["post_processor"] = k.add_bos && k.bos >= 0 ? bos_template(k) : Json();
  Json::Array decoders{
      Json::Object{{"type", "Replace"}, {"pattern", Json::Object{{"String", metaspace}}}, {"content", " "}},
      Json::Object{{"type", "ByteFallback"}}, Json::Object{{"type", "Fuse"}}};
  if (prefix) decoders.push_back(Json::Object{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  tj["decoder"] = Json::Object{{"type", "Sequence"}, {"decoders", decoders}};
  tj["model"] = bpe_model(std::move(vocab), std::move(merges), /*spm=*/true, /*ignore_merges=*/false,
                          k.unk >= 0 ? Json(k.token(k.unk)) : Json());
  tj["model"]["gguf_scores"] = *scores;
}

}  // namespace

GgufTokenizer gguf_tokenizer(const GgufHeader& h, const std::string& path) {
  const VocabKeys k = vocab_keys(h, path);
  auto [vocab, added] = vocab_and_added(k);
  Json tj = Json::Object{{"version", "1.0"}, {"truncation", Json()}, {"padding", Json()}, {"added_tokens", added}};
  if (k.model == "llama")
    sentencepiece_tokenizer(k, std::move(vocab), tj);
  else
    byte_level_tokenizer(k, std::move(vocab), tj);
  const auto token_or_null = [&](int64_t id) { return id >= 0 ? Json(k.token(id)) : Json(); };
  Json config = Json::Object{
      {"bos_token", token_or_null(k.bos)}, {"eos_token", token_or_null(k.eot >= 0 ? k.eot : k.eos)},
      {"pad_token", token_or_null(k.pad)}, {"unk_token", token_or_null(k.unk)},
      {"add_bos_token", k.add_bos},        {"add_eos_token", false}};
  if (const Json* t = h.find("tokenizer.chat_template"); t && t->is_string()) config["chat_template"] = *t;
  return {tj.dump(), config.dump()};
}

std::string gguf_tokenizer_dir(const std::string& path) {
  namespace fs = std::filesystem;
  const GgufTokenizer t = gguf_tokenizer(read_gguf_header(path), path);
  const std::string both = t.tokenizer_json + "\n" + t.tokenizer_config_json;
  const std::string sum = checksum64_hex(std::span(reinterpret_cast<const uint8_t*>(both.data()), both.size()));
  const fs::path dir = fs::temp_directory_path() / ("castor-gguf-tokenizer-" + sum);
  const auto holds_it = [&] {
    std::error_code ec;
    if (fs::is_symlink(dir, ec) || !fs::is_directory(dir, ec)) return false;
    const std::vector<uint8_t> a = read_file((dir / "tokenizer.json").string());
    const std::vector<uint8_t> b = read_file((dir / "tokenizer_config.json").string());
    return std::string(a.begin(), a.end()) == t.tokenizer_json &&
           std::string(b.begin(), b.end()) == t.tokenizer_config_json;
  };
  try {
    if (holds_it()) return dir.string();
  } catch (const Error&) {
  }
  std::string made = (fs::temp_directory_path() / "castor-gguf-tokenizer-XXXXXX").string();
  CASTOR_CHECK(mkdtemp(made.data()), path, ": cannot make a directory for its tokenizer under ",
               fs::temp_directory_path().string());
  const auto bytes = [](const std::string& s) {
    return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  atomic_write_file(made + "/tokenizer.json", bytes(t.tokenizer_json));
  atomic_write_file(made + "/tokenizer_config.json", bytes(t.tokenizer_config_json));
  std::error_code ec;
  fs::rename(made, dir, ec);
  if (ec) {  // another process made it first, or a stale one is in the way
    fs::remove_all(made, ec);
    CASTOR_CHECK(holds_it(), path, ": ", dir.string(), " holds other files than its tokenizer; remove it");
  }
  return dir.string();
}

}  // namespace castor::formats
