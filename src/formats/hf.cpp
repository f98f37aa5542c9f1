// Hugging Face Llama-family directories to and from Castor's Llama (castor/hf.h).
#include "castor/hf.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "castor/autograd.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "castor/log.h"
#include "castor/output_dir.h"

namespace castor::formats {

namespace fs = std::filesystem;

namespace {

// The Hugging Face architectures of the Llama family, one row each: what their modelling files compute beyond
// LlamaForCausalLM's (modeling_llama.py, _mistral.py, _qwen2.py; configuration_*.py's defaults). All three name their
// tensors by hf_layout and take head_dim, rope_scaling / rope_parameters and tie_word_embeddings alike.
struct HfArchitecture {
  const char* name;        // config.json's "architectures"
  const char* model_type;  // its "model_type"
  bool reads_bias_keys;    // "attention_bias" (q, k, v and o biased) and "mlp_bias" are read (Llama's)
  bool qkv_bias;           // q, k and v always have biases, o none (Qwen2's)
  enum Window {
    None,
    Every,
    FromLayer
  } window;                   // its sliding window: none (the keys are not read), on every
                              // layer (Mistral's sliding_window), or Qwen2's: with
                              // use_sliding_window, on layers max_window_layers and up
  int64_t default_window;     // sliding_window when the key is absent
  int64_t default_positions;  // max_position_embeddings when absent
};
constexpr HfArchitecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", true, false, HfArchitecture::None, 0, 2048},
    {"MistralForCausalLM", "mistral", false, false, HfArchitecture::Every, 4096, 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", false, true, HfArchitecture::FromLayer, 4096, 32768},
};
constexpr int64_t kQwen2WindowLayers = 28;  // Qwen2's max_window_layers when absent

const HfArchitecture* architecture_named(const std::string& name) {
  for (const HfArchitecture& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

// The files a Hugging Face tokenizer is made of, copied into an export when the run's directory has them.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model", "chat_template.jinja"};

Json read_json(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, 1 << 26);
  try {
    return Json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
}

// config.json's keys, read with the file named in every error.
struct ConfigReader {
  const Json& json;
  std::string path;
  const Json* get(const char* key) const {
    const Json* v = json.find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const Json* v = get(key);
    if (!v) {
      CASTOR_CHECK(fallback, path, ": \"", key, "\" is missing");
      return *fallback;
    }
    CASTOR_CHECK(v->is_int() && v->as_int() > 0, path, ": \"", key, "\" must be a positive integer, got ", v->dump());
    return v->as_int();
  }
  double number(const char* key, double fallback) const {
    const Json* v = get(key);
    if (!v) return fallback;
    CASTOR_CHECK(v->is_number() && v->as_double() > 0, path, ": \"", key, "\" must be a positive number, got ",
                 v->dump());
    return v->as_double();
  }
  bool flag(const char* key, bool fallback) const {
    const Json* v = get(key);
    if (!v) return fallback;
    CASTOR_CHECK(v->is_bool(), path, ": \"", key, "\" must be true or false, got ", v->dump());
    return v->as_bool();
  }
};

DType dtype_of_name(const std::string& name, const std::string& path) {
  if (name == "float32") return DType::Float32;
  if (name == "float16") return DType::Float16;
  if (name == "bfloat16") return DType::BFloat16;
  throw Error(detail::cat(path, ": \"torch_dtype\" ", name, ": not float32, float16 or bfloat16"));
}
const char* dtype_json_name(DType d) {
  return d == DType::Float16 ? "float16" : d == DType::BFloat16 ? "bfloat16" : "float32";
}

}  // namespace

Tensor permute_rows(const Tensor& t, int64_t heads, bool to_castor) {
  const Tensor src = t.contiguous();
  const int64_t rows = src.shape()[0], d = rows / heads, row_bytes = src.nbytes() / rows;
  Tensor dst = empty(src.shape(), src.dtype());
  const auto* in = static_cast<const uint8_t*>(src.data_ptr());
  auto* out = static_cast<uint8_t*>(dst.data_ptr());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t p = 0; p < d / 2; ++p)
      for (int64_t e = 0; e < 2; ++e) {
        const int64_t hf = h * d + e * (d / 2) + p, castor = h * d + 2 * p + e;
        const int64_t from = to_castor ? hf : castor, to = to_castor ? castor : hf;
        std::memcpy(out + to * row_bytes, in + from * row_bytes, row_bytes);
      }
  return dst;
}

namespace {

// The layout row's name with "{i}" replaced by layer `i`.
std::string layer_name(const char* pattern, int64_t i) {
  std::string s = pattern;
  if (const size_t at = s.find("{i}"); at != std::string::npos) s.replace(at, 3, std::to_string(i));
  return s;
}

// One tensor of a model: its Castor name, Hugging Face name, shape, and the heads its rows are permuted over (0: none).
struct Planned {
  std::string castor, hf;
  Shape shape;
  int64_t permute_heads = 0;
};

// Whether config `c` has the tensor of Castor name `n` (the biases are optional; output.weight is absent when tied).
bool has_tensor(const models::LlamaConfig& c, const std::string& n) {
  if (n == "output.weight") return !c.tied;
  if (!n.ends_with(".bias")) return true;
  if (n.ends_with("wo.bias")) return c.attention_bias;
  if (n.find(".attention.") != std::string::npos) return c.attention_bias || c.qkv_bias;
  return c.mlp_bias;  // w1, w2, w3
}

std::vector<Planned> plan(const models::LlamaConfig& c) {
  const int64_t D = c.head_size(), H = c.n_heads, KV = c.kv_heads(), F = c.ffn_hidden_dim();
  std::vector<Planned> out;
  for (const TensorName& row : hf_layout()) {
    const std::string castor = row.castor;
    // (rows, columns) of a weight, and the heads its rows are permuted over; a bias is its rows.
    auto shape_of = [&](const std::string& n) -> std::pair<Shape, int64_t> {
      const bool bias = n.ends_with(".bias");
      auto rows = [&](int64_t r, int64_t cols, int64_t heads) -> std::pair<Shape, int64_t> {
        return {bias ? Shape{r} : Shape{r, cols}, heads};
      };
      if (n == "tok_embeddings.weight" || n == "output.weight") return rows(c.vocab_size, c.dim, 0);
      if (n == "norm.weight" || n.ends_with("_norm.weight")) return {{c.dim}, 0};
      if (n.find(".wq.") != std::string::npos) return rows(H * D, c.dim, H);
      if (n.find(".wk.") != std::string::npos) return rows(KV * D, c.dim, KV);
      if (n.find(".wv.") != std::string::npos) return rows(KV * D, c.dim, 0);
      if (n.find(".wo.") != std::string::npos) return rows(c.dim, H * D, 0);
      if (n.find(".w2.") != std::string::npos) return rows(c.dim, F, 0);
      return rows(F, c.dim, 0);  // w1, w3
    };
    if (!has_tensor(c, layer_name(row.castor, 0))) continue;
    const int64_t layers = castor.find("{i}") == std::string::npos ? 1 : c.n_layers;
    for (int64_t i = 0; i < layers; ++i) {
      const std::string name = layer_name(row.castor, i);
      const auto [shape, heads] = shape_of(name);
      out.push_back({name, layer_name(row.file, i), shape, heads});
    }
  }
  return out;
}

// Where each Hugging Face tensor is: DIR/model.safetensors for all, or the index's weight_map.
std::map<std::string, std::string> shard_map(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
  std::map<std::string, std::string> where;
  if (file_exists(index)) {
    const Json j = read_json(index);
    const Json* map = j.is_object() ? j.find("weight_map") : nullptr;
    CASTOR_CHECK(map && map->is_object(), index, ": \"weight_map\" is missing or not an object");
    for (const auto& [name, file] : map->as_object()) {
      CASTOR_CHECK(file.is_string() && !file.as_string().empty() && file.as_string().find('/') == std::string::npos,
                   index, ": weight_map[\"", name, "\"] is not a file name in the directory");
      where[name] = dir + "/" + file.as_string();
    }
    return where;
  }
  if (!file_exists(single)) {
    std::error_code ec;
    const bool pickle = file_exists(dir + "/pytorch_model.bin") || file_exists(dir + "/pytorch_model.bin.index.json");
    CASTOR_CHECK(!pickle, dir,
                 ": holds pytorch_model.bin (a pickle, which Castor does not load: it can run code); convert it "
                 "elsewhere with transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, "
                 "safe_serialization=True)");
    throw Error(detail::cat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  for (const SafetensorsEntry& e : read_safetensors_header(single).entries) where[e.name] = single;
  return where;
}

// The headers of the shards, each read once, and where each file's data section begins.
struct Shards {
  std::map<std::string, SafetensorsFile> headers;
  std::map<std::string, uint64_t> data_offset;
  const SafetensorsEntry& entry(const std::string& file, const std::string& name) {
    auto it = headers.find(file);
    if (it == headers.end()) {
      CASTOR_CHECK(file_exists(file), file, ": missing (model.safetensors.index.json lists it for ", name, ")");
      it = headers.emplace(file, read_safetensors_header(file)).first;
      uint64_t size = 0, end = 0;
      read_file_range(file, 0, 0, size);
      for (const SafetensorsEntry& e : it->second.entries) end = std::max(end, e.end);
      data_offset[file] = size - end;
    }
    const SafetensorsEntry* e = it->second.find(name);
    CASTOR_CHECK(e, file, ": no tensor ", name);
    return *e;
  }
};

}  // namespace

const std::vector<TensorName>& hf_layout() {
  static const std::vector<TensorName> layout = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"},
      {"layers.{i}.attention.wq.weight", "model.layers.{i}.self_attn.q_proj.weight"},
      {"layers.{i}.attention.wq.bias", "model.layers.{i}.self_attn.q_proj.bias"},
      {"layers.{i}.attention.wk.weight", "model.layers.{i}.self_attn.k_proj.weight"},
      {"layers.{i}.attention.wk.bias", "model.layers.{i}.self_attn.k_proj.bias"},
      {"layers.{i}.attention.wv.weight", "model.layers.{i}.self_attn.v_proj.weight"},
      {"layers.{i}.attention.wv.bias", "model.layers.{i}.self_attn.v_proj.bias"},
      {"layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"},
      {"layers.{i}.attention.wo.bias", "model.layers.{i}.self_attn.o_proj.bias"},
      {"layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"},
      {"layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"},
      {"layers.{i}.feed_forward.w1.bias", "model.layers.{i}.mlp.gate_proj.bias"},
      {"layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"},
      {"layers.{i}.feed_forward.w3.bias", "model.layers.{i}.mlp.up_proj.bias"},
      {"layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"},
      {"layers.{i}.feed_forward.w2.bias", "model.layers.{i}.mlp.down_proj.bias"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  return layout;
}

StateDict hf_adapters(const models::LlamaConfig& c, const StateDict& adapters, bool to_castor) {
  const std::vector<Planned> weights = plan(c);
  std::map<std::string, const Planned*> by_name;  // a weight's name in the adapters' naming
  for (const Planned& w : weights) by_name.emplace(to_castor ? w.hf : w.castor, &w);
  StateDict out;
  for (const auto& [name, t] : adapters) {
    const size_t at = name.find(".lora_");
    const auto it = at == std::string::npos ? by_name.end() : by_name.find(name.substr(0, at) + ".weight");
    if (it == by_name.end()) {
      out.emplace(name, t);
      continue;
    }
    const Planned& w = *it->second;
    const std::string& other = to_castor ? w.castor : w.hf;  // "<path>.weight"
    const bool permute = w.permute_heads > 0 && name.find(".lora_B.") != std::string::npos && t.dim() == 2 &&
                         t.shape()[0] == w.shape[0];
    out.emplace(other.substr(0, other.size() - 7) + name.substr(at),
                permute ? permute_rows(t, w.permute_heads, to_castor) : t);
  }
  return out;
}

std::string hf_target_name(const std::string& name, bool to_castor) {
  // The last part of a layout row's path ("layers.{i}.attention.wq.weight" -> "wq").
  const auto last = [](const std::string& row) {
    const std::string path = row.substr(0, row.rfind('.'));
    return path.substr(path.rfind('.') + 1);
  };
  for (const TensorName& row : hf_layout())
    if (last(to_castor ? row.file : row.castor) == name) return last(to_castor ? row.castor : row.file);
  return name;
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(fs::path(path) / "config.json", ec)) return false;
  for (const char* weights :
       {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"})
    if (fs::exists(fs::path(path) / weights, ec)) return true;
  return false;  // (a Castor run directory holds a config.json too, its weights under checkpoints/)
}

namespace {

// rope_scaling (v4) or rope_parameters (v5) as F::RopeScaling: default, linear and llama3; any other type changes the
// math in a way Castor does not compute, an error naming the key.
F::RopeScaling rope_scaling_of(const Json* p, const char* key, const std::string& path) {
  F::RopeScaling out;
  if (!p) return out;
  CASTOR_CHECK(p->is_object(), path, ": \"", key, "\" is not an object");
  const ConfigReader r{*p, path};
  const Json* type = r.get("rope_type") ? r.get("rope_type") : r.get("type");
  CASTOR_CHECK(!type || type->is_string(), path, ": \"", key, "\".rope_type is not a string");
  const std::string kind = type ? type->as_string() : "default";
  using Type = F::RopeScaling::Type;
  if (kind == "default") return out;
  CASTOR_CHECK(kind == "linear" || kind == "llama3", path, ": \"", key, "\" of type ", kind,
               ": Castor computes rope types default, linear and llama3 only");
  out.type = kind == "linear" ? Type::Linear : Type::Llama3;
  auto required = [&](const char* field) {
    CASTOR_CHECK(r.get(field), path, ": \"", key, "\" of type ", kind, " has no \"", field, "\"");
    return r.number(field, 0);
  };
  out.factor = required("factor");
  if (out.type == Type::Llama3) {
    out.low_freq_factor = required("low_freq_factor");
    out.high_freq_factor = required("high_freq_factor");
    CASTOR_CHECK(r.get("original_max_position_embeddings"), path, ": \"", key, "\" of type llama3 has no ",
                 "\"original_max_position_embeddings\"");
    out.original_max_position_embeddings = r.integer("original_max_position_embeddings");
  }
  try {
    out.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": \"", key, "\": ", e.what()));
  }
  return out;
}

// The sliding window of `a` as config.json sets it: (window, first windowed layer), (0, 0) for none.
std::pair<int64_t, int64_t> window_of(const HfArchitecture& a, const ConfigReader& r, int64_t layers) {
  if (a.window == HfArchitecture::None) return {0, 0};
  const Json* w = r.json.find("sliding_window");
  CASTOR_CHECK(!w || w->is_null() || (w->is_int() && w->as_int() > 0), r.path,
               ": \"sliding_window\" must be a positive integer or null, got ", w ? w->dump() : "");
  const int64_t window = !w ? a.default_window : w->is_null() ? 0 : w->as_int();
  if (a.window == HfArchitecture::Every || window == 0) return {window, 0};
  if (const Json* types = r.get("layer_types")) {  // (transformers v5 writes each layer's kind)
    CASTOR_CHECK(types->is_array() && static_cast<int64_t>(types->as_array().size()) == layers, r.path,
                 ": \"layer_types\" must list num_hidden_layers kinds");
    int64_t from = layers;
    for (int64_t i = layers - 1; i >= 0; --i) {
      const Json& t = types->as_array()[i];
      CASTOR_CHECK(t.is_string() && (t.as_string() == "full_attention" || t.as_string() == "sliding_attention"), r.path,
                   ": \"layer_types\"[", i, "] ", t.dump(), ": not full_attention or sliding_attention");
      if (t.as_string() == "sliding_attention") {
        CASTOR_CHECK(from == i + 1, r.path, ": \"layer_types\": sliding_attention layers must be the last ones ",
                     "(Castor's window applies from one layer on)");
        from = i;
      }
    }
    return from == layers ? std::pair<int64_t, int64_t>{0, 0} : std::pair{window, from};
  }
  if (!r.flag("use_sliding_window", false)) return {0, 0};
  const Json* m = r.get("max_window_layers");
  CASTOR_CHECK(!m || (m->is_int() && m->as_int() >= 0), r.path, ": \"max_window_layers\" must be a layer count");
  const int64_t from = m ? m->as_int() : kQwen2WindowLayers;
  return from >= layers ? std::pair<int64_t, int64_t>{0, 0} : std::pair{window, from};
}

}  // namespace

HfConfig parse_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const Json json = read_json(path);
  CASTOR_CHECK(json.is_object(), path, ": not a JSON object");
  const ConfigReader r{json, path};
  HfConfig h;
  const Json* arch = r.get("architectures");
  CASTOR_CHECK(arch && arch->is_array() && arch->as_array().size() == 1 && arch->as_array()[0].is_string(), path,
               ": \"architectures\" must list one architecture (LlamaForCausalLM, MistralForCausalLM or "
               "Qwen2ForCausalLM)");
  h.architecture = arch->as_array()[0].as_string();
  const HfArchitecture* a = architecture_named(h.architecture);
  CASTOR_CHECK(a, path, ": architecture ", h.architecture,
               " is not one Castor reads (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  // What Castor's Llama does not compute: refused, naming the key.
  if (const Json* act = r.get("hidden_act"))
    CASTOR_CHECK(act->is_string() && act->as_string() == "silu", path, ": \"hidden_act\" ", act->dump(),
                 ": Castor's Llama computes SwiGLU with silu only");
  for (const char* key : {"quantization_config", "attn_logit_softcapping", "final_logit_softcapping"})
    CASTOR_CHECK(!r.get(key), path, ": \"", key, "\" is not supported (it changes what the model computes)");
  if (const Json* f = r.get("partial_rotary_factor"))
    CASTOR_CHECK(f->is_number() && f->as_double() == 1.0, path, ": \"partial_rotary_factor\" ", f->dump(),
                 ": Castor rotates whole heads");
  models::LlamaConfig& l = h.llama;
  // rope: v4's rope_theta / rope_scaling, v5's rope_parameters {rope_type, rope_theta, ...}.
  l.rope_theta = r.number("rope_theta", 10000.0);
  if (const Json* p = r.get("rope_parameters")) {
    CASTOR_CHECK(p->is_object(), path, ": \"rope_parameters\" is not an object");
    l.rope_theta = ConfigReader{*p, path}.number("rope_theta", l.rope_theta);
    l.rope_scaling = rope_scaling_of(p, "rope_parameters", path);
  } else {
    l.rope_scaling = rope_scaling_of(r.get("rope_scaling"), "rope_scaling", path);
  }
  l.dim = r.integer("hidden_size");
  l.n_layers = r.integer("num_hidden_layers");
  l.n_heads = r.integer("num_attention_heads");
  l.n_kv_heads = r.integer("num_key_value_heads", l.n_heads);
  l.hidden_dim = r.integer("intermediate_size");
  l.vocab_size = r.integer("vocab_size");
  l.norm_eps = r.number("rms_norm_eps", 1e-6);
  l.max_seq_len = h.max_position_embeddings = r.integer("max_position_embeddings", a->default_positions);
  l.tied = r.flag("tie_word_embeddings", false);
  l.dropout = 0.0;
  // head_dim: config.json's, else hidden_size / num_attention_heads (recorded only when it is not that).
  CASTOR_CHECK(r.get("head_dim") || l.dim % l.n_heads == 0, path, ": \"hidden_size\" ", l.dim,
               " is not a multiple of \"num_attention_heads\" ", l.n_heads, " and \"head_dim\" is not given");
  const int64_t head_dim = r.integer("head_dim", l.dim / l.n_heads);
  l.head_dim = head_dim * l.n_heads == l.dim ? 0 : head_dim;
  if (a->reads_bias_keys) l.attention_bias = r.flag("attention_bias", false), l.mlp_bias = r.flag("mlp_bias", false);
  l.qkv_bias = a->qkv_bias;
  std::tie(l.sliding_window, l.sliding_window_from) = window_of(*a, r, l.n_layers);
  h.bos = json.find("bos_token_id") ? json.at("bos_token_id") : Json();
  h.eos = json.find("eos_token_id") ? json.at("eos_token_id") : Json();
  const Json* dtype = r.get("dtype") ? r.get("dtype") : r.get("torch_dtype");
  if (dtype) {
    CASTOR_CHECK(dtype->is_string(), path, ": \"torch_dtype\" is not a string");
    h.dtype = dtype_of_name(dtype->as_string(), path);
  }
  try {
    l.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
  return h;
}

namespace {

// The config.json keys a planned tensor's shape comes from, for errors.
const char* shape_keys(const std::string& hf) {
  if (hf.ends_with("embed_tokens.weight") || hf.ends_with("lm_head.weight")) return "vocab_size x hidden_size";
  if (hf.ends_with("norm.weight") || hf.ends_with("layernorm.weight")) return "hidden_size";
  if (hf.find("q_proj") != std::string::npos) return "num_attention_heads x head_dim, hidden_size";
  if (hf.find("k_proj") != std::string::npos || hf.find("v_proj") != std::string::npos)
    return "num_key_value_heads x head_dim, hidden_size";
  if (hf.find("o_proj") != std::string::npos) return "hidden_size, num_attention_heads x head_dim";
  if (hf.find("down_proj") != std::string::npos) return "hidden_size, intermediate_size";
  return "intermediate_size, hidden_size";  // gate_proj, up_proj
}

// Every tensor config.json describes present in DIR's headers with its shape and a float dtype, before anything is
// made: a size in config.json is checked against the tensors, never trusted to allocate (num_hidden_layers 1e9 would
// plan 1e10 tensors). castor::Error naming config.json and the key, or the file and the tensor.
void check_tensors(const std::string& dir, const HfConfig& config, const std::map<std::string, std::string>& where,
                   Shards& shards) {
  int64_t layers = 0;  // as the tensor names number them: model.layers.N.
  for (const auto& [name, file] : where) {
    if (!name.starts_with("model.layers.")) continue;
    // (an index past the number of tensors is no layer a file holds: each has several)
    const long long i = std::strtoll(name.c_str() + std::strlen("model.layers."), nullptr, 10);
    if (i >= 0 && i < static_cast<long long>(where.size())) layers = std::max<int64_t>(layers, i + 1);
  }
  CASTOR_CHECK(config.llama.n_layers <= layers, dir, "/config.json: \"num_hidden_layers\" ", config.llama.n_layers,
               ", but the tensors hold ", layers, " layers (model.layers.0 to model.layers.", layers - 1, ")");
  std::set<std::string> named;
  for (const Planned& t : plan(config.llama)) {
    const auto it = where.find(t.hf);
    CASTOR_CHECK(it != where.end(), dir, ": no tensor ", t.hf,
                 t.castor == "output.weight" ? " (config.json: tie_word_embeddings false)" : "");
    const SafetensorsEntry& e = shards.entry(it->second, t.hf);
    CASTOR_CHECK(e.dtype == DType::Float32 || e.dtype == DType::Float16 || e.dtype == DType::BFloat16, it->second, ": ",
                 t.hf, " is ", dtype_name(e.dtype), ", not float32, float16 or bfloat16");
    CASTOR_CHECK(Shape(e.shape.begin(), e.shape.end()) == t.shape, it->second, ": ", t.hf, " has shape ",
                 shape_str(Shape(e.shape.begin(), e.shape.end())), ", config.json gives ", shape_str(t.shape), " (",
                 shape_keys(t.hf), ")");
    named.insert(t.hf);
  }
  // The tensors config.json does not name, which nothing reads: one warning naming them (as transformers warns of
  // weights a checkpoint holds that the model does not use; once a process for a directory, which a command may read
  // more than once).
  std::string unused;
  int64_t count = 0;
  for (const auto& [name, file] : where)
    if (!named.count(name) && ++count <= 8) unused += detail::cat(count == 1 ? "" : ", ", printable(name));
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (count > 0 && warned.insert(absolute_path(dir)).second)
    warn(detail::cat(dir, ": ", count, count == 1 ? " tensor" : " tensors",
                     " that config.json does not name, not used: ", unused, count > 8 ? ", ..." : ""));
}

}  // namespace

HfConfig read_hf_config(const std::string& dir) {
  const HfConfig config = parse_hf_config(dir);
  Shards shards;
  check_tensors(dir, config, shard_map(dir), shards);
  return config;
}

Json hf_description(const HfConfig& h) {
  Json d = llama_description(h.llama);
  d["architecture"] = h.architecture;
  d["bos_token_id"] = h.bos;
  d["eos_token_id"] = h.eos;
  d["max_position_embeddings"] = h.max_position_embeddings;
  return d;
}

Metadata hf_metadata(const HfConfig& h, const std::string& data) {
  return {{"castor.config", llama_settings(h.llama, hf_description(h), data).dump()},
          {"castor.model", "llama"},
          {"hf.architecture", h.architecture}};
}

void read_hf_weights_each(const std::string& dir, const HfConfig& config,
                          const std::function<void(const std::string&, const Tensor&)>& take) {
  const std::map<std::string, std::string> where = shard_map(dir);
  // Every tensor present with config.json's shape before any is read.
  Shards shards;
  check_tensors(dir, config, where, shards);
  const std::vector<Planned> tensors = plan(config.llama);
  for (const Planned& t : tensors) {
    const std::string& file = where.at(t.hf);
    const SafetensorsEntry& e = shards.entry(file, t.hf);
    uint64_t size = 0;
    Tensor x = empty(t.shape, e.dtype);  // read straight into it
    read_file_range_into(file, shards.data_offset.at(file) + e.begin,
                         std::span<uint8_t>(static_cast<uint8_t*>(x.data_ptr()), x.nbytes()), size);
    if (t.permute_heads > 0) x = permute_rows(x, t.permute_heads, /*to_castor=*/true);
    take(t.castor, x);
  }
}

StateDict read_hf_weights(const std::string& dir, const HfConfig& config, DType dtype) {
  StateDict state;
  read_hf_weights_each(dir, config, [&](const std::string& name, const Tensor& t) {
    state.emplace(name, t.dtype() == dtype ? t : t.to(dtype));
  });
  if (config.llama.tied) state.emplace("output.weight", state.at("tok_embeddings.weight"));
  return state;
}

SafetensorsFile read_hf_header(const std::string& dir) {
  const HfConfig config = read_hf_config(dir);
  const std::map<std::string, std::string> where = shard_map(dir);
  const std::vector<Planned> tensors = plan(config.llama);
  Shards shards;
  check_tensors(dir, config, where, shards);
  SafetensorsFile out;
  for (const Planned& t : tensors) {
    SafetensorsEntry e = shards.entry(where.at(t.hf), t.hf);
    e.name = t.castor;
    out.entries.push_back(e);
  }
  out.metadata = hf_metadata(config, "");
  return out;
}

namespace {

// config.json of `c` as architecture o.architecture writes it, after checking that the architecture computes `c`
// (castor::Error naming DIR and the key otherwise).
Json config_json(const std::string& dir, const models::LlamaConfig& c, const HfWriteOptions& o, DType dtype) {
  const HfArchitecture* a = architecture_named(o.architecture);
  CASTOR_CHECK(a, dir, ": architecture ", o.architecture,
               " is not one Castor writes (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  CASTOR_CHECK(c.head_size() % 2 == 0, dir, ": the head size is odd");
  CASTOR_CHECK(a->reads_bias_keys || !(c.attention_bias || c.mlp_bias), dir, ": ", a->name, " has no ",
               c.attention_bias ? "attention_bias" : "mlp_bias", " (the model's projections have biases)");
  CASTOR_CHECK(a->qkv_bias == c.qkv_bias, dir, ": ", a->name, a->qkv_bias ? " has" : " has no",
               " q/k/v biases and the model ", c.qkv_bias ? "has" : "has none");
  const bool windowed = c.sliding_window > 0 && c.sliding_window_from < c.n_layers;
  CASTOR_CHECK(!windowed || a->window == HfArchitecture::FromLayer ||
                   (a->window == HfArchitecture::Every && c.sliding_window_from == 0),
               dir, ": ", a->name, " has no sliding_window ", c.sliding_window_from > 0 ? "from a layer on" : "",
               " (the model attends through one of ", c.sliding_window, ")");
  Json rope;  // null: default
  if (const F::RopeScaling& r = c.rope_scaling; r.type == F::RopeScaling::Type::Linear) {
    rope = Json::Object{{"rope_type", "linear"}, {"factor", r.factor}};
  } else if (r.type == F::RopeScaling::Type::Llama3) {
    rope = Json::Object{{"rope_type", "llama3"},
                        {"factor", r.factor},
                        {"low_freq_factor", r.low_freq_factor},
                        {"high_freq_factor", r.high_freq_factor},
                        {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  Json config = Json::Object{
      {"architectures", Json::Array{a->name}},
      {"model_type", a->model_type},
      {"hidden_size", c.dim},
      {"intermediate_size", c.ffn_hidden_dim()},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.kv_heads()},
      {"head_dim", c.head_size()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", o.max_position_embeddings > 0 ? o.max_position_embeddings : c.max_seq_len},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope},
      {"tie_word_embeddings", c.tied},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
      {"bos_token_id", o.bos},
      {"eos_token_id", o.eos},
      {"torch_dtype", dtype_json_name(dtype)}};
  if (a->reads_bias_keys) config["attention_bias"] = c.attention_bias, config["mlp_bias"] = c.mlp_bias;
  if (a->window == HfArchitecture::Every) config["sliding_window"] = windowed ? Json(c.sliding_window) : Json();
  if (a->window == HfArchitecture::FromLayer) {
    config["use_sliding_window"] = windowed;
    config["sliding_window"] = windowed ? Json(c.sliding_window) : Json();
    config["max_window_layers"] = windowed ? c.sliding_window_from : c.n_layers;
  }
  return config;
}

}  // namespace

bool is_hf_export_file(const std::string& name) {
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json"})
    if (name == f) return true;
  for (const char* f : kTokenizerFiles)
    if (name == f) return true;
  // A shard: model-0000K-of-0000N.safetensors.
  const auto digits = [&](size_t at) {
    return std::all_of(name.begin() + at, name.begin() + at + 5, [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return name.size() == 32 && name.starts_with("model-") && digits(6) && name.compare(11, 4, "-of-") == 0 &&
         digits(15) && name.ends_with(".safetensors");
}

void write_hf(const std::string& dir, const models::LlamaConfig& c, const StateDict& state, const HfWriteOptions& o) {
  check_output_dir("--out", dir, is_hf_export_file, "a Hugging Face export");
  // The tensors as the files hold them, in the layout's order, before anything is written.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Planned& t : plan(c)) {
    const auto it = state.find(t.castor);
    CASTOR_CHECK(it != state.end(), dir, ": the model has no ", t.castor);
    CASTOR_CHECK(it->second.shape() == t.shape, dir, ": ", t.castor, " has shape ", shape_str(it->second.shape()),
                 ", the config gives ", shape_str(t.shape));
    Tensor x = it->second.contiguous();
    if (t.permute_heads > 0) x = permute_rows(x, t.permute_heads, /*to_castor=*/false);
    tensors.emplace_back(t.hf, x);
  }
  const Json config = config_json(dir, c, o, tensors.front().second.dtype());
  // Shards: in order, a new one when the next tensor would pass the size (a tensor alone may).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].second.nbytes();
    if (!shards.back().empty() && bytes + n > o.max_shard_bytes) shards.emplace_back(), bytes = 0;
    shards.back().push_back(i);
    bytes += n, total += n;
  }
  write_output_dir("--out", dir, is_hf_export_file, "a Hugging Face export", {}, [&](const std::string& folder) {
    const fs::path tmp(folder);
    Json::Object weight_map;
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      const std::string file = shards.size() == 1 ? "model.safetensors" : name;
      std::vector<SafetensorsTensor> st;
      for (size_t i : shards[s]) {
        const Tensor& x = tensors[i].second;
        st.push_back({tensors[i].first, x.dtype(), x.shape(), x.data_ptr(), static_cast<size_t>(x.nbytes())});
        weight_map[tensors[i].first] = file;
      }
      write_safetensors((tmp / file).string(), st, {{"format", "pt"}});
    }
    if (shards.size() > 1)
      atomic_write_file(
          (tmp / "model.safetensors.index.json").string(),
          Json(Json::Object{{"metadata", Json::Object{{"total_size", total}}}, {"weight_map", weight_map}}).dump(2));
    atomic_write_file((tmp / "config.json").string(), config.dump(2));
    atomic_write_file(
        (tmp / "generation_config.json").string(),
        Json(Json::Object{{"_from_model_config", true}, {"bos_token_id", o.bos}, {"eos_token_id", o.eos}}).dump(2));
    if (!o.tokenizer_dir.empty())
      for (const char* f : kTokenizerFiles)
        if (file_exists(o.tokenizer_dir + "/" + f)) {
          const std::vector<uint8_t> b = read_file(o.tokenizer_dir + "/" + f);
          atomic_write_file((tmp / f).string(), std::span<const uint8_t>(b));
        }
  });
}

}  // namespace castor::formats
