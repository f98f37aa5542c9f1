// Reading GGUF v3 files (castor/gguf.h): the header checked field by field, a llama or qwen2 model's description and
// tensors under Castor's names, and the tokenizer its metadata holds.
#include <unistd.h>

#include <algorithm>
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

// llama.cpp's names of a Llama's tensors (the writer's, castor/gguf.h), "{i}" the layer.
const std::vector<formats::TensorName>& gguf_layout() {
  static const std::vector<formats::TensorName> layout = {
      {"tok_embeddings.weight", "token_embd.weight"},
      {"norm.weight", "output_norm.weight"},
      {"output.weight", "output.weight"},
      {"layers.{i}.attention_norm.weight", "blk.{i}.attn_norm.weight"},
      {"layers.{i}.attention.wq.weight", "blk.{i}.attn_q.weight"},
      {"layers.{i}.attention.wk.weight", "blk.{i}.attn_k.weight"},
      {"layers.{i}.attention.wv.weight", "blk.{i}.attn_v.weight"},
      {"layers.{i}.attention.wo.weight", "blk.{i}.attn_output.weight"},
      {"layers.{i}.attention.wq.bias", "blk.{i}.attn_q.bias"},
      {"layers.{i}.attention.wk.bias", "blk.{i}.attn_k.bias"},
      {"layers.{i}.attention.wv.bias", "blk.{i}.attn_v.bias"},
      {"layers.{i}.ffn_norm.weight", "blk.{i}.ffn_norm.weight"},
      {"layers.{i}.feed_forward.w1.weight", "blk.{i}.ffn_gate.weight"},
      {"layers.{i}.feed_forward.w3.weight", "blk.{i}.ffn_up.weight"},
      {"layers.{i}.feed_forward.w2.weight", "blk.{i}.ffn_down.weight"}};
  return layout;
}

// The Castor name of a file's tensor (the layout read backwards), or "".
std::string castor_name(const std::string& file_name) {
  for (const formats::TensorName& row : gguf_layout()) {
    const std::string pattern = row.file;
    const size_t at = pattern.find("{i}");
    if (at == std::string::npos) {
      if (pattern == file_name) return row.castor;
      continue;
    }
    const std::string head = pattern.substr(0, at), tail = pattern.substr(at + 3);
    if (file_name.size() <= head.size() + tail.size() || !file_name.starts_with(head) || !file_name.ends_with(tail))
      continue;
    const std::string index = file_name.substr(head.size(), file_name.size() - head.size() - tail.size());
    if (index.empty() || !std::all_of(index.begin(), index.end(), ::isdigit)) continue;
    std::string out = row.castor;
    out.replace(out.find("{i}"), 3, index);
    return out;
  }
  return "";
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
  CASTOR_CHECK(!tensor_named(h, "rope_freqs.weight"), path,
               ": tensor rope_freqs.weight (per-pair rope factors, Llama 3.1's rope scaling) is not read");
  const GgufTensorInfo* embd = tensor_named(h, "token_embd.weight");
  CASTOR_CHECK(embd && embd->ne.size() == 2 && static_cast<int64_t>(embd->ne[0]) == l.dim, path,
               ": no tensor token_embd.weight of [", l.dim, ", vocabulary]");
  l.vocab_size = static_cast<int64_t>(embd->ne[1]);
  l.tied = !tensor_named(h, "output.weight");
  l.qkv_bias = tensor_named(h, "blk.0.attn_q.bias") != nullptr;
  CASTOR_CHECK(!a.qwen2 || l.qkv_bias, path, ": arch qwen2 without q/k/v biases (blk.0.attn_q.bias)");
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

Metadata gguf_metadata(const GgufHeader& h, const std::string& path, const std::string& data) {
  const Json settings = formats::llama_settings(gguf_llama_config(h, path), gguf_description(h, path), data);
  return {{"castor.config", settings.dump()}, {"castor.model", "llama"}, {"gguf.architecture", arch_of(h, path).name}};
}

namespace {

// A file tensor's Castor name and shape, checked against the description's model.
struct Planned {
  std::string name;
  Shape shape;
  DType dtype;
};
Planned plan(const GgufTensorInfo& t, const std::string& path) {
  const std::string name = castor_name(t.name);
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
    const Planned p = plan(t, path);
    f.entries.push_back({p.name, p.dtype, p.shape, t.begin, t.begin + t.bytes});
  }
  f.metadata = gguf_metadata(h, path, "");
  return f;
}

void read_gguf_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take) {
  const GgufHeader h = read_gguf_header(path);
  const LlamaConfig l = gguf_llama_config(h, path);
  const bool qwen2 = arch_of(h, path).qwen2;
  std::vector<Planned> planned;
  for (const GgufTensorInfo& t : h.tensors) {
    planned.push_back(plan(t, path));
    CASTOR_CHECK(t.type == 0 || t.type == 1 || t.type == 30 || t.type == 8, path, ": tensor ", printable(t.name),
                 ": type ", ggml_type_name(t.type), " is not read yet (f32, f16, bf16 and q8_0 are)");
  }
  uint64_t size = 0;
  read_file_range(path, 0, 0, size);
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const GgufTensorInfo& t = h.tensors[i];
    const Planned& p = planned[i];
    Tensor x;
    if (t.type == 8) {
      const std::vector<uint8_t> blocks = read_file_range(path, t.begin, t.bytes, size);
      x = empty(p.shape, DType::Float32);
      quant::block_type(quant::BlockType::Q8_0).dequantize(blocks.data(), static_cast<float*>(x.data_ptr()), x.numel());
    } else {
      x = empty(p.shape, p.dtype);
      read_file_range_into(path, t.begin, std::span<uint8_t>(static_cast<uint8_t*>(x.data_ptr()), x.nbytes()), size);
    }
    // qwen2 keeps Hugging Face's rotate-half rows in wq and wk (and their biases): Castor's are interleaved.
    const bool q = p.name.find(".wq.") != std::string::npos, k = p.name.find(".wk.") != std::string::npos;
    if (qwen2 && (q || k)) x = formats::permute_rows(x, q ? l.n_heads : l.kv_heads(), /*to_castor=*/true);
    take(p.name, x);
  }
}

GgufTokenizer gguf_tokenizer(const GgufHeader& h, const std::string& path) {
  const auto text = [&](const char* key) -> std::string {
    const Json* v = h.find(key);
    return v && v->is_string() ? v->as_string() : "";
  };
  const std::string model = text("tokenizer.ggml.model"), pre = text("tokenizer.ggml.pre");
  CASTOR_CHECK(model == "gpt2" || model == "llama", path, ": tokenizer.ggml.model ", printable(model),
               model.empty() ? "(none)" : "", " is not read (gpt2: byte-level BPE, llama: SentencePiece)");
  const Json* tokens = h.find("tokenizer.ggml.tokens");
  CASTOR_CHECK(tokens && tokens->is_array() && !tokens->as_array().empty(), path,
               ": tokenizer.ggml.tokens is missing or not an array");
  const Json::Array& tok = tokens->as_array();
  const auto n = static_cast<int64_t>(tok.size());
  const auto array_of = [&](const char* key) -> const Json::Array* {
    const Json* v = h.find(key);
    if (!v) return nullptr;
    CASTOR_CHECK(v->is_array() && static_cast<int64_t>(v->as_array().size()) == n, path, ": ", key,
                 " is not an array of ", n, " (one per token)");
    return &v->as_array();
  };
  const Json::Array* types = array_of("tokenizer.ggml.token_type");
  const auto type_of = [&](int64_t id) { return types ? (*types)[id].as_int() : 1; };
  const auto id_key = [&](const char* key) -> int64_t {
    const Json* v = h.find(key);
    if (!v) return -1;
    CASTOR_CHECK(v->is_int() && v->as_int() >= 0 && v->as_int() < n, path, ": ", key, " ", v->dump(),
                 " is not a token id below ", n);
    return v->as_int();
  };
  const int64_t bos = id_key("tokenizer.ggml.bos_token_id"), eos = id_key("tokenizer.ggml.eos_token_id");
  const int64_t eot = id_key("tokenizer.ggml.eot_token_id"), unk = id_key("tokenizer.ggml.unknown_token_id");
  const int64_t pad = id_key("tokenizer.ggml.padding_token_id");
  const Json* add_bos_key = h.find("tokenizer.ggml.add_bos_token");
  const bool spm = model == "llama";
  const bool add_bos = add_bos_key ? add_bos_key->is_bool() && add_bos_key->as_bool() : spm;
  Json::Object vocab;
  Json::Array added;
  for (int64_t id = 0; id < n; ++id) {
    CASTOR_CHECK(tok[id].is_string(), path, ": tokenizer.ggml.tokens[", id, "] is not a string");
    const std::string& t = tok[id].as_string();
    const int64_t type = type_of(id);
    if (type == 3 || type == 4)  // control and user-defined: matched in the raw text
      added.push_back(Json::Object{{"id", id},
                                   {"content", t},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", type == 3}});
    CASTOR_CHECK(vocab.emplace(t, id).second || type == 5, path, ": tokenizer.ggml.tokens[", id, "] '", printable(t),
                 "' appears twice");
  }
  Json::Array merges;
  Json tj = Json::Object{{"version", "1.0"}, {"truncation", Json()}, {"padding", Json()}, {"added_tokens", added}};
  const auto bos_template = [&]() -> Json {
    const std::string b = tok[bos].as_string();
    return Json::Object{
        {"type", "TemplateProcessing"},
        {"single", Json::Array{Json::Object{{"SpecialToken", Json::Object{{"id", b}, {"type_id", 0}}}},
                               Json::Object{{"Sequence", Json::Object{{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", Json::Array{Json::Object{{"SpecialToken", Json::Object{{"id", b}, {"type_id", 0}}}},
                             Json::Object{{"Sequence", Json::Object{{"id", "A"}, {"type_id", 0}}}},
                             Json::Object{{"Sequence", Json::Object{{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens",
         Json::Object{{b, Json::Object{{"id", b}, {"ids", Json::Array{bos}}, {"tokens", Json::Array{b}}}}}}};
  };
  if (!spm) {
    const Json* m = h.find("tokenizer.ggml.merges");
    CASTOR_CHECK(m && m->is_array(), path, ": tokenizer.ggml.merges is missing (byte-level BPE needs it)");
    for (const Json& s : m->as_array()) {
      CASTOR_CHECK(s.is_string() && s.as_string().find(' ') != std::string::npos, path,
                   ": tokenizer.ggml.merges holds ", s.dump().substr(0, 40), ", not \"a b\"");
      merges.push_back(s);
    }
    const Json byte_level = Json::Object{
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
    Json pre_tokenizer;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
      pre_tokenizer = Json::Object{
          {"type", "Sequence"},
          {"pretokenizers",
           Json::Array{Json::Object{{"type", "Split"},
                                    {"pattern", Json::Object{{"Regex", std::string(data::hf_split_regex(
                                                                           pre == "qwen2" ? 1 : 3))}}},
                                    {"behavior", "Isolated"},
                                    {"invert", false}},
                       byte_level}}};
    } else if (pre == "gpt-2" || pre == "default" || pre.empty()) {
      pre_tokenizer = byte_level;
      pre_tokenizer["use_regex"] = true;
    } else {
      throw Error(detail::cat(path, ": tokenizer.ggml.pre ", printable(pre),
                              " is not read (llama-bpe, qwen2, gpt-2 and default are)"));
    }
    tj["normalizer"] = pre == "qwen2" ? Json(Json::Object{{"type", "NFC"}}) : Json();
    tj["pre_tokenizer"] = pre_tokenizer;
    tj["post_processor"] = add_bos && bos >= 0 ? bos_template() : byte_level;
    tj["decoder"] = byte_level;
    tj["model"] = Json::Object{{"type", "BPE"},
                               {"dropout", Json()},
                               {"unk_token", Json()},
                               {"continuing_subword_prefix", Json()},
                               {"end_of_word_suffix", Json()},
                               {"fuse_unk", false},
                               {"byte_fallback", false},
                               {"ignore_merges", pre == "llama-bpe" || pre == "llama3"},
                               {"vocab", vocab},
                               {"merges", merges}};
  } else {
    const Json::Array* scores = array_of("tokenizer.ggml.scores");
    CASTOR_CHECK(scores, path, ": tokenizer.ggml.scores is missing (a SentencePiece tokenizer needs it)");
    // Every split of a normal token into two tokens is a merge, ranked by the merged token's score (highest first),
    // then the left part's length (llama.cpp's leftmost pair among equals: kept by BPE's left-to-right ties).
    struct Merge {
      double score;
      int64_t id;
      size_t cut;
    };
    std::vector<Merge> all;
    for (int64_t id = 0; id < n; ++id) {
      if (type_of(id) != 1) continue;
      const std::string& t = tok[id].as_string();
      for (size_t cut = 1; cut < t.size(); ++cut) {
        if ((static_cast<uint8_t>(t[cut]) & 0xC0) == 0x80) continue;  // (inside a UTF-8 character)
        const auto l = vocab.find(t.substr(0, cut)), r = vocab.find(t.substr(cut));
        if (l != vocab.end() && r != vocab.end() && type_of(l->second.as_int()) == 1 &&
            type_of(r->second.as_int()) == 1)
          all.push_back({(*scores)[id].as_double(), id, cut});
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
    for (const Merge& m : all) {
      const std::string& t = tok[m.id].as_string();
      merges.push_back(Json::Array{t.substr(0, m.cut), t.substr(m.cut)});
    }
    const Json* prefix_key = h.find("tokenizer.ggml.add_space_prefix");
    const bool prefix = !prefix_key || (prefix_key->is_bool() && prefix_key->as_bool());
    const Json replace = Json::Object{
        {"type", "Replace"}, {"pattern", Json::Object{{"String", " "}}}, {"content", "\xE2\x96\x81"}};
    tj["normalizer"] = prefix ? Json(Json::Object{{"type", "Sequence"},
                                                  {"normalizers", Json::Array{Json::Object{{"type", "Prepend"},
                                                                                           {"prepend", "\xE2\x96\x81"}},
                                                                              replace}}})
                              : replace;
    tj["pre_tokenizer"] = Json();
    tj["post_processor"] = add_bos && bos >= 0 ? bos_template() : Json();
    Json::Array decoders{
        Json::Object{{"type", "Replace"}, {"pattern", Json::Object{{"String", "\xE2\x96\x81"}}}, {"content", " "}},
        Json::Object{{"type", "ByteFallback"}}, Json::Object{{"type", "Fuse"}}};
    if (prefix) decoders.push_back(Json::Object{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tj["decoder"] = Json::Object{{"type", "Sequence"}, {"decoders", decoders}};
    tj["model"] = Json::Object{{"type", "BPE"},
                               {"dropout", Json()},
                               {"unk_token", unk >= 0 ? Json(tok[unk].as_string()) : Json()},
                               {"continuing_subword_prefix", Json()},
                               {"end_of_word_suffix", Json()},
                               {"fuse_unk", true},
                               {"byte_fallback", true},
                               {"ignore_merges", false},
                               {"vocab", vocab},
                               {"merges", merges}};
  }
  const auto token_or_null = [&](int64_t id) { return id >= 0 ? Json(tok[id].as_string()) : Json(); };
  Json config = Json::Object{{"bos_token", token_or_null(bos)}, {"eos_token", token_or_null(eot >= 0 ? eot : eos)},
                             {"pad_token", token_or_null(pad)}, {"unk_token", token_or_null(unk)},
                             {"add_bos_token", add_bos},        {"add_eos_token", false}};
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
