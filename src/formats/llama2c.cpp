// llama2.c's v0 and v1 model files to and from llama2.c-named state dicts (include/castor/llama2c.h).
#include "castor/llama2c.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/json.h"

namespace castor::formats {

using models::LlamaConfig;

namespace {

const char* const kFreqReal = "freq_cis_real";
const char* const kFreqImag = "freq_cis_imag";

// One kind of tensor in a file: a global one (`name`) or one per layer (`layer_suffix` under layers.{i}.).
struct Entry {
  std::string name, layer_suffix;
  Shape shape;  // one layer's for per-layer kinds
};

// export.py's orders: legacy_export's (v0) and version1_export's (v1).
std::vector<Entry> layout(const Llama2cConfig& c, int version, bool shared) {
  const int64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, hs = c.head_size();
  const int64_t q = c.n_heads * hs, kv = c.n_kv_heads * hs;
  const Entry emb{"tok_embeddings.weight", "", {V, D}}, norm{"norm.weight", "", {D}};
  const Entry att_norm{"", "attention_norm.weight", {D}}, ffn_norm{"", "ffn_norm.weight", {D}};
  const Entry wq{"", "attention.wq.weight", {q, D}}, wk{"", "attention.wk.weight", {kv, D}};
  const Entry wv{"", "attention.wv.weight", {kv, D}}, wo{"", "attention.wo.weight", {D, q}};
  const Entry w1{"", "feed_forward.w1.weight", {H, D}}, w2{"", "feed_forward.w2.weight", {D, H}};
  const Entry w3{"", "feed_forward.w3.weight", {H, D}};
  std::vector<Entry> out;
  if (version == 0) {
    const Entry real{kFreqReal, "", {c.max_seq_len, hs / 2}}, imag{kFreqImag, "", {c.max_seq_len, hs / 2}};
    out = {emb, att_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, norm, real, imag};
  } else {
    out = {att_norm, ffn_norm, norm, emb, wq, wk, wv, wo, w1, w2, w3};
  }
  if (!shared) out.push_back({"output.weight", "", {V, D}});
  return out;
}

std::string layer_name(int64_t i, const std::string& suffix) { return detail::cat("layers.", i, ".", suffix); }

uint64_t header_bytes(int version) { return version == 0 ? kLlama2cV0HeaderBytes : kLlama2cV1HeaderBytes; }

std::string describe(const Llama2cConfig& c) {
  return detail::cat("dim ", c.dim, ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers, ", n_heads ", c.n_heads,
                     ", n_kv_heads ", c.n_kv_heads, ", vocab_size ", c.vocab_size, ", max_seq_len ", c.max_seq_len);
}

// The file's size its header implies, in 128 bits: a hostile header may ask for more than 64 bits count.
unsigned __int128 implied_size(const Llama2cConfig& c, int version, bool shared) {
  unsigned __int128 floats = 0;
  for (const Entry& e : layout(c, version, shared)) {
    unsigned __int128 n = e.layer_suffix.empty() ? 1 : static_cast<uint64_t>(c.n_layers);
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    floats += n;
  }
  return header_bytes(version) + 4 * floats;
}

// Where a global entry starts in the file.
uint64_t offset_of(const Llama2cConfig& c, int version, bool shared, const std::string& name) {
  uint64_t offset = header_bytes(version);
  for (const Entry& e : layout(c, version, shared)) {
    if (e.name == name) return offset;
    offset += 4 * static_cast<uint64_t>(shape_numel(e.shape) * (e.layer_suffix.empty() ? 1 : c.n_layers));
  }
  CASTOR_ASSERT(false, "no entry ", name, " in the llama2.c layout");
  return 0;
}

// The first element of v0 tables (cos, sin) that differs from llama2.c's tables of `theta` by more than the float32
// rounding of another pow and cos allows, as "row p, pair k"; empty when none does.
std::string table_mismatch(const Tensor& cos, const Tensor& sin, int64_t head_size, double theta) {
  const int64_t T = cos.size(0), half = cos.size(1);
  const auto [want_cos, want_sin] = models::rotary_tables(T, head_size, theta);
  const float *c = cos.data<float>(), *s = sin.data<float>();
  const float *wc = want_cos.contiguous().data<float>(), *ws = want_sin.contiguous().data<float>();
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(k) / head_size);
      const double tol = 2e-6 + 1e-6 * angle;
      const int64_t i = p * half + k;
      if (!(std::abs(c[i] - wc[i]) <= tol && std::abs(s[i] - ws[i]) <= tol))
        return detail::cat("row ", p, ", pair ", k);
    }
  }
  return "";
}

// The theta of v0 tables (max_seq_len, head_size / 2): estimated from the angle of position 1's last pair
// (theta^(-2 (half - 1) / head_size)), then the first of its 3-significant-digit rounding, its integer rounding and
// itself whose tables match. Tables of one position or one pair are the same for every theta: llama2.c's 10000.
double rope_theta_of(const Tensor& cos, const Tensor& sin, int64_t head_size, const std::string& path) {
  const int64_t T = cos.size(0), half = cos.size(1);
  std::vector<double> candidates{10000.0};
  if (T >= 2 && half >= 2) {
    const double angle = std::atan2(sin.data<float>()[2 * half - 1], cos.data<float>()[2 * half - 1]);
    const double estimate = std::exp(-std::log(angle) * static_cast<double>(head_size) / (2.0 * (half - 1)));
    if (std::isfinite(estimate) && estimate > 1) {
      const double unit = std::pow(10.0, std::floor(std::log10(estimate)) - 2);
      candidates = {std::round(estimate / unit) * unit, std::round(estimate), estimate};
    }
  }
  for (double theta : candidates)
    if (table_mismatch(cos, sin, head_size, theta).empty()) return theta;
  CASTOR_CHECK(false, path,
               ": llama2.c v0 RoPE tables (freq_cis_real, freq_cis_imag) are not llama2.c's for any theta"
               " (theta ",
               candidates[0], " differs at ", table_mismatch(cos, sin, head_size, candidates[0]), ")");
  return 0;
}

Tensor read_floats(const std::string& path, uint64_t offset, const Shape& shape, uint64_t& file_size) {
  const std::vector<uint8_t> bytes = read_file_range(path, offset, 4 * static_cast<uint64_t>(shape_numel(shape)),
                                                     file_size);
  return from_blob(bytes.data(), shape, DType::Float32);
}

// The header fields of a file's first bytes (`head`, up to 256): version, the seven ints, the classifier flag.
Llama2cHeader parse_header(const std::string& path, const std::vector<uint8_t>& head, uint64_t file_size) {
  uint32_t magic = 0;
  if (head.size() >= 4) std::memcpy(&magic, head.data(), 4);
  Llama2cHeader h;
  int32_t f[7];
  if (magic == kLlama2cMagic) {
    CASTOR_CHECK(file_size >= kLlama2cV1HeaderBytes, path, ": llama2.c v1 file is ", file_size,
                 " bytes, shorter than its 256-byte header");
    int32_t version = 0;
    std::memcpy(&version, head.data() + 4, 4);
    CASTOR_CHECK(version == 1, path, ": llama2.c file version ", version,
                 " is not supported (versions 0 and 1, float32, are; 2 is llama2.c's int8 format)");
    std::memcpy(f, head.data() + 8, sizeof(f));
    const uint8_t flag = head[8 + sizeof(f)];
    CASTOR_CHECK(flag <= 1, path, ": llama2.c v1 header's shared-classifier byte is ", int(flag), ", expected 0 or 1");
    CASTOR_CHECK(f[5] > 0, path, ": llama2.c header field vocab_size must be positive, got ", f[5]);
    h.version = 1, h.shared_classifier = flag == 1;
  } else {
    CASTOR_CHECK(file_size >= kLlama2cV0HeaderBytes, path, ": is ", file_size,
                 " bytes, shorter than a llama2.c v0 header (28 bytes)");
    std::memcpy(f, head.data(), sizeof(f));
    CASTOR_CHECK(f[5] != INT32_MIN, path, ": llama2.c header field vocab_size is out of range");
    h.version = 0, h.shared_classifier = f[5] > 0;  // legacy_export: negative when the output layer is not shared
    f[5] = std::abs(f[5]);
  }
  Llama2cConfig& c = h.config;
  c.dim = f[0], c.hidden_dim = f[1], c.n_layers = f[2], c.n_heads = f[3], c.n_kv_heads = f[4], c.vocab_size = f[5];
  c.max_seq_len = f[6];
  return h;
}

// What a float32 Llama run of a file's architecture would record (see load_llama2c_weights_file); `multiple_of` 0:
// none gives the file's hidden_dim, and the key is left out.
Metadata llama2c_metadata(const Llama2cHeader& h, int64_t multiple_of, const std::string& data) {
  const Llama2cConfig& c = h.config;
  Json config = Json::Object{
      {"model", "llama"},          {"n_layer", c.n_layers},       {"n_head", c.n_heads},
      {"n_embd", c.dim},           {"block_size", c.max_seq_len}, {"vocab_size", c.vocab_size},
      {"n_kv_head", c.n_kv_heads}, {"rope_theta", c.rope_theta},  {"untied", !h.shared_classifier}};
  if (multiple_of > 0) config["multiple_of"] = multiple_of;
  if (!data.empty()) config["data"] = data;
  return {{"castor.config", config.dump()},
          {"llama2c.header",
           detail::cat("version ", h.version, ", ", describe(c), h.shared_classifier ? ", shared" : ", unshared",
                       " classifier, rope_theta ", c.rope_theta)}};
}

bool bit_equal_floats(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor x = a.detach().to(DType::Float32).contiguous(), y = b.detach().to(DType::Float32).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), 4 * static_cast<size_t>(x.numel())) == 0;
}

}  // namespace

void Llama2cConfig::validate(const std::string& what) const {
  const char* names[] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"};
  const int64_t values[] = {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len};
  for (int i = 0; i < 7; ++i)
    CASTOR_CHECK(values[i] > 0 && values[i] <= INT32_MAX, what, ": ", names[i], " must be in 1..2^31-1, got ",
                 values[i]);
  CASTOR_CHECK(dim % n_heads == 0, what, ": dim ", dim, " is not a multiple of n_heads ", n_heads);
  CASTOR_CHECK(head_size() % 2 == 0, what, ": head size ", head_size(), " (dim / n_heads) is odd; RoPE needs pairs");
  CASTOR_CHECK(n_heads % n_kv_heads == 0, what, ": n_heads ", n_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
  CASTOR_CHECK(std::isfinite(rope_theta) && rope_theta > 1, what, ": rope_theta must be above 1, got ", rope_theta);
}

std::vector<std::pair<std::string, Shape>> llama2c_tensors(const Llama2cConfig& config, int version, bool shared) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const Entry& e : layout(config, version, shared)) {
    if (e.layer_suffix.empty()) {
      out.emplace_back(e.name, e.shape);
    } else {
      for (int64_t i = 0; i < config.n_layers; ++i) out.emplace_back(layer_name(i, e.layer_suffix), e.shape);
    }
  }
  return out;
}

Llama2cHeader read_llama2c_header(const std::string& path) {
  uint64_t size = 0;
  read_file_range(path, 0, 0, size);
  Llama2cHeader h = parse_header(path, read_file_range(path, 0, std::min(size, kLlama2cV1HeaderBytes), size), size);
  Llama2cConfig& c = h.config;
  c.validate(detail::cat(path, ": llama2.c header"));
  const unsigned __int128 want = implied_size(c, h.version, h.shared_classifier);
  CASTOR_CHECK(want == size, path, ": llama2.c v", h.version, " file is ", size, " bytes, its header (", describe(c),
               h.shared_classifier ? ", shared" : ", unshared", " classifier) needs ",
               want > UINT64_MAX ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(want)));
  if (h.version == 0) {
    const Shape table{c.max_seq_len, c.head_size() / 2};
    const Tensor cos = read_floats(path, offset_of(c, 0, h.shared_classifier, kFreqReal), table, size);
    const Tensor sin = read_floats(path, offset_of(c, 0, h.shared_classifier, kFreqImag), table, size);
    c.rope_theta = rope_theta_of(cos, sin, c.head_size(), path);
  }
  return h;
}

Llama2cWeights read_llama2c(const std::string& path) {
  const Llama2cHeader h = read_llama2c_header(path);
  Llama2cWeights w{h.config, {}};
  uint64_t offset = header_bytes(h.version), size = 0;
  // One read per kind of tensor (all layers together), never the whole file at once.
  for (const Entry& e : layout(h.config, h.version, h.shared_classifier)) {
    const int64_t layers = e.layer_suffix.empty() ? 1 : h.config.n_layers;
    Shape all = e.shape;
    all.insert(all.begin(), layers);
    const Tensor t = read_floats(path, offset, all, size);
    offset += 4 * static_cast<uint64_t>(t.numel());
    if (e.name == kFreqReal || e.name == kFreqImag) continue;
    if (e.layer_suffix.empty()) {
      w.state[e.name] = t.reshape(e.shape);
    } else {
      for (int64_t i = 0; i < layers; ++i) w.state[layer_name(i, e.layer_suffix)] = t.select(0, i).contiguous();
    }
  }
  if (h.shared_classifier) w.state["output.weight"] = w.state.at("tok_embeddings.weight");
  return w;
}

namespace {

// castor::Error "<what>: ..." unless `state` holds exactly the tensors of `c` with their shapes (output.weight
// optional: without it the classifier is shared).
void check_state(const Llama2cConfig& c, const StateDict& state, const std::string& what) {
  std::map<std::string, Shape> want;
  for (const auto& [name, shape] : llama2c_tensors(c, 1, false)) want[name] = shape;
  for (const auto& [name, shape] : want) {
    auto it = state.find(name);
    CASTOR_CHECK(it != state.end() || name == "output.weight", what, ": no tensor ", name);
    if (it != state.end())
      CASTOR_CHECK(it->second.shape() == shape, what, ": ", name, " is ", shape_str(it->second.shape()), ", expected ",
                   shape_str(shape), " (", describe(c), ")");
  }
  for (const auto& [name, t] : state) CASTOR_CHECK(want.count(name), what, ": unexpected tensor ", printable(name));
}

// The header of `version` (0: 7 ints, vocab_size negative when not shared; 1: magic, version, 7 ints, flag, zeros).
std::vector<uint8_t> header_of(const Llama2cConfig& c, int version, bool shared) {
  std::vector<uint8_t> bytes(header_bytes(version), 0);
  const int64_t vocab = version == 0 && !shared ? -c.vocab_size : c.vocab_size;
  const int32_t fields[] = {int32_t(c.dim),        int32_t(c.hidden_dim), int32_t(c.n_layers),   int32_t(c.n_heads),
                            int32_t(c.n_kv_heads), int32_t(vocab),        int32_t(c.max_seq_len)};
  if (version == 0) {
    std::memcpy(bytes.data(), fields, sizeof(fields));
  } else {
    const int32_t one = 1;
    std::memcpy(bytes.data(), &kLlama2cMagic, 4);
    std::memcpy(bytes.data() + 4, &one, 4);
    std::memcpy(bytes.data() + 8, fields, sizeof(fields));
    bytes[8 + sizeof(fields)] = shared ? 1 : 0;
  }
  return bytes;
}

}  // namespace

void write_llama2c(const std::string& path, const Llama2cWeights& w, int version) {
  const Llama2cConfig& c = w.config;
  const std::string what = detail::cat(path, ": cannot write llama2.c file");
  CASTOR_CHECK(version == 0 || version == 1, what, ": version ", version, " (0 or 1 are written)");
  c.validate(what);
  CASTOR_CHECK(version == 0 || c.rope_theta == 10000.0, what, ": v1 files record no RoPE theta (llama2.c's is ",
               "10000), the model's is ", c.rope_theta, "; write v0, whose tables record it");
  check_state(c, w.state, what);
  const bool shared = shares_classifier(w);
  std::vector<uint8_t> bytes = header_of(c, version, shared);
  auto append = [&](const Tensor& t) {
    const Tensor f = t.detach().to(DType::Float32).contiguous();
    const auto* p = static_cast<const uint8_t*>(f.data_ptr());
    bytes.insert(bytes.end(), p, p + 4 * f.numel());
  };
  for (const auto& [name, shape] : llama2c_tensors(c, version, shared)) {
    if (name == kFreqReal || name == kFreqImag) {
      const auto [cos, sin] = models::rotary_tables(c.max_seq_len, c.head_size(), c.rope_theta);
      append(name == kFreqReal ? cos : sin);
    } else {
      append(w.state.at(name));
    }
  }
  atomic_write_file(path, std::span<const uint8_t>(bytes));
}

bool shares_classifier(const Llama2cWeights& w) {
  auto out = w.state.find("output.weight"), emb = w.state.find("tok_embeddings.weight");
  return out == w.state.end() || (emb != w.state.end() && bit_equal_floats(out->second, emb->second));
}

LlamaConfig llama_config(const Llama2cWeights& w) {
  const Llama2cConfig& f = w.config;
  LlamaConfig c;
  c.dim = f.dim, c.n_layers = f.n_layers, c.n_heads = f.n_heads, c.n_kv_heads = f.n_kv_heads;
  c.vocab_size = f.vocab_size, c.hidden_dim = f.hidden_dim, c.max_seq_len = f.max_seq_len;
  c.rope_theta = f.rope_theta, c.norm_eps = 1e-5, c.dropout = 0.0, c.tied = shares_classifier(w);
  return c;
}

Llama2cConfig llama2c_config(const LlamaConfig& c, const std::string& what) {
  CASTOR_CHECK(c.norm_eps == 1e-5, what, ": norm_eps is ", c.norm_eps,
               "; llama2.c files record none, and run.c normalizes with 1e-5");
  // (Hugging Face's options, which run.c does not compute)
  const char* extra = c.attention_bias || c.qkv_bias || c.mlp_bias        ? "biases"
                      : c.head_size() * c.n_heads != c.dim                ? "a head_dim other than dim / n_heads"
                      : c.rope_scaling.type != F::RopeScaling::Type::None ? "rope scaling"
                      : c.sliding_window > 0                              ? "a sliding window"
                                                                          : nullptr;
  CASTOR_CHECK(!extra, what, ": the model has ", extra, ", which llama2.c files do not hold");
  Llama2cConfig f;
  f.dim = c.dim, f.hidden_dim = c.ffn_hidden_dim(), f.n_layers = c.n_layers, f.n_heads = c.n_heads;
  f.n_kv_heads = c.kv_heads(), f.vocab_size = c.vocab_size, f.max_seq_len = c.max_seq_len;
  f.rope_theta = c.rope_theta;
  f.validate(what);
  return f;
}

int64_t llama2c_multiple_of(const Llama2cConfig& c, const std::string& what) {
  LlamaConfig rule;
  rule.dim = c.dim, rule.multiple_of = 1;
  const int64_t least = rule.ffn_hidden_dim();  // model.py's 2/3 of 4 dim, before rounding up
  CASTOR_CHECK(c.hidden_dim >= least, what, ": hidden_dim ", c.hidden_dim, " is below ", least, ", 2/3 of 4 x dim ",
               c.dim, ": no --multiple-of gives it");
  rule.multiple_of = LlamaConfig{}.multiple_of;
  return rule.ffn_hidden_dim() == c.hidden_dim ? rule.multiple_of : c.hidden_dim;
}

LoadedTensors load_llama2c_weights_file(const std::string& path, const std::string& data) {
  const Llama2cHeader h = read_llama2c_header(path);
  const int64_t multiple_of = llama2c_multiple_of(h.config, path);
  return {read_llama2c(path).state, llama2c_metadata(h, multiple_of, data)};
}

SafetensorsFile read_llama2c_weights_header(const std::string& path) {
  const Llama2cHeader h = read_llama2c_header(path);
  SafetensorsFile f;
  uint64_t offset = 0;
  for (const auto& [name, shape] : llama2c_tensors(h.config, h.version, h.shared_classifier)) {
    const uint64_t bytes = 4 * static_cast<uint64_t>(shape_numel(shape));
    f.entries.push_back({name, DType::Float32, shape, offset, offset + bytes});
    offset += bytes;
  }
  int64_t multiple_of = 0;
  try {
    multiple_of = llama2c_multiple_of(h.config, path);
  } catch (const Error&) {  // listed all the same: the header records hidden_dim
  }
  f.metadata = llama2c_metadata(h, multiple_of, "");
  return f;
}

}  // namespace castor::formats
