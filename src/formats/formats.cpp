// The pieces every format shares (castor/formats.h): castor.config metadata and tensor-name layouts.
#include "castor/formats.h"

#include <algorithm>
#include <cctype>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/ops.h"

namespace castor::formats {

Json castor_config(const Metadata& meta, const std::string& what) {
  const auto it = meta.find("castor.config");
  if (it == meta.end()) return Json();
  Json config;
  try {
    config = Json::parse(it->second);
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": metadata castor.config: ", e.what()));
  }
  CASTOR_CHECK(config.is_object(), what, ": metadata castor.config: not a JSON object");
  return config;
}

void check_finite(const std::string& what, const std::string& name, const Tensor& t) {
  CASTOR_CHECK(!is_floating(t.dtype()) || isfinite_all(t), what, ": tensor ", printable(name),
               " holds NaN or infinite values (the file is damaged, or the run that wrote it had diverged)");
}

namespace {

// `pattern` with "{i}" matched against `name`: the layer index digits, or "" (and false) when it does not match.
bool match(const std::string& pattern, const std::string& name, std::string& index) {
  const size_t at = pattern.find("{i}");
  if (at == std::string::npos) return index.clear(), pattern == name;
  const std::string head = pattern.substr(0, at), tail = pattern.substr(at + 3);
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  index = name.substr(head.size(), name.size() - head.size() - tail.size());
  for (char ch : index)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  return true;
}

// A number of a description; castor::Error naming `what` and the key when it is missing.
double number(const Json& d, const char* key, const std::string& what) {
  const Json* v = d.is_object() ? d.find(key) : nullptr;
  CASTOR_CHECK(v && v->is_number(), what, ": the model description has no number \"", key, "\"");
  return v->as_double();
}
int64_t integer(const Json& d, const char* key, const std::string& what) {
  return static_cast<int64_t>(number(d, key, what));
}
bool flag(const Json& d, const char* key, const std::string& what) {
  const Json* v = d.is_object() ? d.find(key) : nullptr;
  CASTOR_CHECK(v && v->is_bool(), what, ": the model description has no boolean \"", key, "\"");
  return v->as_bool();
}

}  // namespace

const char* const kRopeTypes[] = {"default", "linear", "llama3"};  // (F::RopeScaling::Type's order)

Json llama_description(const models::LlamaConfig& l) {
  Json d = Json::Object{{"family", "llama"},
                        {"dim", l.dim},
                        {"n_layers", l.n_layers},
                        {"n_heads", l.n_heads},
                        {"n_kv_heads", l.kv_heads()},
                        {"vocab_size", l.vocab_size},
                        {"hidden_dim", l.ffn_hidden_dim()},
                        {"norm_eps", l.norm_eps},
                        {"max_seq_len", l.max_seq_len},
                        {"rope_theta", l.rope_theta},
                        {"tied", l.tied},
                        {"dropout", l.dropout}};
  // Hugging Face's options, recorded where they are set (a llama2.c model's description is as it was).
  if (l.head_dim > 0 && l.head_dim * l.n_heads != l.dim) d["head_dim"] = l.head_dim;
  if (l.attention_bias) d["attention_bias"] = true;
  if (l.qkv_bias) d["qkv_bias"] = true;
  if (l.mlp_bias) d["mlp_bias"] = true;
  if (const F::RopeScaling& r = l.rope_scaling; r.type != F::RopeScaling::Type::None) {
    Json s = Json::Object{{"type", kRopeTypes[static_cast<int>(r.type)]}, {"factor", r.factor}};
    if (r.type == F::RopeScaling::Type::Llama3) {
      s["low_freq_factor"] = r.low_freq_factor, s["high_freq_factor"] = r.high_freq_factor;
      s["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
    d["rope_scaling"] = s;
  }
  if (l.sliding_window > 0) d["sliding_window"] = l.sliding_window;
  if (l.sliding_window > 0 && l.sliding_window_from > 0) d["sliding_window_from"] = l.sliding_window_from;
  return d;
}

models::LlamaConfig llama_config(const Json& d, const std::string& what) {
  models::LlamaConfig l;
  l.dim = integer(d, "dim", what), l.n_layers = integer(d, "n_layers", what);
  l.n_heads = integer(d, "n_heads", what), l.n_kv_heads = integer(d, "n_kv_heads", what);
  l.vocab_size = integer(d, "vocab_size", what), l.hidden_dim = integer(d, "hidden_dim", what);
  l.norm_eps = number(d, "norm_eps", what), l.max_seq_len = integer(d, "max_seq_len", what);
  l.rope_theta = number(d, "rope_theta", what), l.tied = flag(d, "tied", what);
  l.dropout = number(d, "dropout", what);
  if (d.find("head_dim")) l.head_dim = integer(d, "head_dim", what);
  for (auto [key, field] : {std::pair{"attention_bias", &l.attention_bias}, std::pair{"qkv_bias", &l.qkv_bias},
                            std::pair{"mlp_bias", &l.mlp_bias}})
    if (d.find(key)) *field = flag(d, key, what);
  if (const Json* s = d.find("rope_scaling")) {
    const Json* type = s->is_object() ? s->find("type") : nullptr;
    const auto* known = type && type->is_string()
                            ? std::find(std::begin(kRopeTypes), std::end(kRopeTypes), type->as_string())
                            : std::end(kRopeTypes);
    CASTOR_CHECK(known != std::end(kRopeTypes), what, ": the model description's \"rope_scaling\" has no \"type\" ",
                 "default, linear or llama3");
    F::RopeScaling& r = l.rope_scaling;
    r.type = static_cast<F::RopeScaling::Type>(known - std::begin(kRopeTypes));
    if (r.type != F::RopeScaling::Type::None) r.factor = number(*s, "factor", what);
    if (r.type == F::RopeScaling::Type::Llama3) {
      r.low_freq_factor = number(*s, "low_freq_factor", what),
      r.high_freq_factor = number(*s, "high_freq_factor", what);
      r.original_max_position_embeddings = integer(*s, "original_max_position_embeddings", what);
    }
  }
  if (d.find("sliding_window")) l.sliding_window = integer(d, "sliding_window", what);
  if (d.find("sliding_window_from")) l.sliding_window_from = integer(d, "sliding_window_from", what);
  try {
    l.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": ", e.what()));
  }
  return l;
}

Json llama_settings(const models::LlamaConfig& l, const Json& description, const std::string& data) {
  Json config = Json::Object{{"model", "llama"},
                             {"n_layer", l.n_layers},
                             {"n_head", l.n_heads},
                             {"n_embd", l.dim},
                             {"block_size", std::min(l.max_seq_len, kDefaultWindow)},
                             {"vocab_size", l.vocab_size},
                             {"n_kv_head", l.kv_heads()},
                             {"multiple_of", l.ffn_hidden_dim()},
                             {"rope_theta", l.rope_theta},
                             {"untied", !l.tied},
                             {"model_config", description}};
  if (!data.empty()) config["data"] = data;
  return config;
}

Json gpt_description(const models::GPTConfig& g) {
  return Json::Object{{"family", "gpt"},    {"n_layer", g.n_layer},       {"n_head", g.n_head},
                      {"n_embd", g.n_embd}, {"block_size", g.block_size}, {"vocab_size", g.vocab_size},
                      {"bias", g.bias},     {"dropout", g.dropout}};
}

models::GPTConfig gpt_config(const Json& d, const std::string& what) {
  models::GPTConfig g;
  g.n_layer = integer(d, "n_layer", what), g.n_head = integer(d, "n_head", what);
  g.n_embd = integer(d, "n_embd", what), g.block_size = integer(d, "block_size", what);
  g.vocab_size = integer(d, "vocab_size", what), g.bias = flag(d, "bias", what);
  g.dropout = number(d, "dropout", what);
  return g;
}

namespace {

// The name `name` has in the other column of `layout` ("{i}" filled in), or "".
std::string renamed(const std::vector<TensorName>& layout, const std::string& name, bool to_file) {
  std::string index;
  for (const TensorName& row : layout)
    if (match(to_file ? row.castor : row.file, name, index)) {
      std::string out = to_file ? row.file : row.castor;
      if (const size_t at = out.find("{i}"); at != std::string::npos) out.replace(at, 3, index);
      return out;
    }
  return "";
}

}  // namespace

std::string file_name(const std::vector<TensorName>& layout, const std::string& castor_name) {
  return renamed(layout, castor_name, /*to_file=*/true);
}
std::string castor_name(const std::vector<TensorName>& layout, const std::string& file_name) {
  return renamed(layout, file_name, /*to_file=*/false);
}

}  // namespace castor::formats
