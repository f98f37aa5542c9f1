// llm.c's GPT-2 checkpoint format and nanoGPT-named safetensors, to and from Castor's GPT (include/castor/llmc.h).
#include "castor/llmc.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "castor/autograd.h"
#include "castor/formats.h"
#include "castor/hf.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llama2c.h"
#include "castor/model_source.h"

namespace castor::formats {

using models::GPT;
using models::GPTConfig;

namespace {

constexpr uint64_t kHeaderBytes = 256 * sizeof(int32_t);

// One of llm.c's tensors: a global one (`name`) or one per layer (`block_suffix` under transformer.h.{i}.).
struct LlmcTensor {
  std::string name, block_suffix;
  Shape shape;  // of one layer's tensor for per-layer ones
};

// llm.c's order (train_gpt2.c's fill_in_parameter_sizes).
std::vector<LlmcTensor> llmc_layout(const GPTConfig& c) {
  const int64_t C = c.n_embd;
  return {{"transformer.wte.weight", "", {c.vocab_size, C}},
          {"transformer.wpe.weight", "", {c.block_size, C}},
          {"", "ln_1.weight", {C}},
          {"", "ln_1.bias", {C}},
          {"", "attn.c_attn.weight", {3 * C, C}},
          {"", "attn.c_attn.bias", {3 * C}},
          {"", "attn.c_proj.weight", {C, C}},
          {"", "attn.c_proj.bias", {C}},
          {"", "ln_2.weight", {C}},
          {"", "ln_2.bias", {C}},
          {"", "mlp.c_fc.weight", {4 * C, C}},
          {"", "mlp.c_fc.bias", {4 * C}},
          {"", "mlp.c_proj.weight", {C, 4 * C}},
          {"", "mlp.c_proj.bias", {C}},
          {"transformer.ln_f.weight", "", {C}},
          {"transformer.ln_f.bias", "", {C}}};
}

std::string block_name(int64_t i, const std::string& suffix) { return detail::cat("transformer.h.", i, ".", suffix); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The nanoGPT names and shapes of a GPT's tensors (without lm_head.weight).
std::map<std::string, Shape> expected_shapes(const GPTConfig& c) {
  std::map<std::string, Shape> out;
  for (const LlmcTensor& t : llmc_layout(c)) {
    if (!c.bias && ends_with(t.block_suffix.empty() ? t.name : t.block_suffix, "bias")) continue;
    if (t.block_suffix.empty()) {
      out[t.name] = t.shape;
    } else {
      for (int64_t i = 0; i < c.n_layer; ++i) out[block_name(i, t.block_suffix)] = t.shape;
    }
  }
  return out;
}

}  // namespace

Metadata llmc_metadata(const LlmcHeader& h, const std::string& data) {
  const GPTConfig& c = h.config;
  Json config = Json::Object{{"model", "gpt"},
                             {"n_layer", c.n_layer},
                             {"n_head", c.n_head},
                             {"n_embd", c.n_embd},
                             {"block_size", c.block_size},
                             {"vocab_size", c.vocab_size},
                             {"real_vocab_size", c.real_vocab_size > 0 ? c.real_vocab_size : c.vocab_size},
                             {"bias", true}};
  if (!data.empty()) config["data"] = data;
  return {{"castor.config", config.dump()},
          {"llmc.header", detail::cat("version ", h.dtype == DType::Float32 ? kLlmcModelVersion : kLlmcModelVersionBf16,
                                      " (", dtype_name(h.dtype), "), maxT ", c.block_size, ", V ", c.real_vocab_size,
                                      ", L ", c.n_layer, ", NH ", c.n_head, ", C ", c.n_embd, ", Vp ", c.vocab_size)}};
}

LlmcHeader read_llmc_header(const std::string& path) {
  uint64_t file_size = 0;
  read_file_range(path, 0, 0, file_size);
  CASTOR_CHECK(file_size >= kHeaderBytes, path, ": not an llm.c checkpoint: ", file_size,
               " bytes, shorter than its 1024-byte header");
  const std::vector<uint8_t> header_bytes = read_file_range(path, 0, kHeaderBytes, file_size);
  int32_t h[256];
  std::memcpy(h, header_bytes.data(), kHeaderBytes);
  CASTOR_CHECK(h[0] == kLlmcModelMagic, path, ": not an llm.c checkpoint: magic number ", h[0], ", expected ",
               kLlmcModelMagic);
  CASTOR_CHECK(h[1] == kLlmcModelVersion || h[1] == kLlmcModelVersionBf16, path, ": llm.c checkpoint version ", h[1],
               " is not supported (", kLlmcModelVersion, ": float32, ", kLlmcModelVersionBf16, ": bfloat16)");
  const DType dtype = h[1] == kLlmcModelVersion ? DType::Float32 : DType::BFloat16;
  const char* names[] = {"maxT", "V", "L", "NH", "C", "Vp"};
  for (int i = 0; i < 6; ++i)
    CASTOR_CHECK(h[2 + i] > 0, path, ": llm.c header field ", names[i], " must be positive, got ", h[2 + i]);
  GPTConfig c;
  c.block_size = h[2], c.real_vocab_size = h[3], c.n_layer = h[4], c.n_head = h[5], c.n_embd = h[6];
  c.vocab_size = h[7], c.bias = true, c.dropout = 0.0;
  CASTOR_CHECK(c.real_vocab_size <= c.vocab_size, path, ": llm.c header has V ", c.real_vocab_size,
               " larger than padded Vp ", c.vocab_size);
  CASTOR_CHECK(c.n_embd % c.n_head == 0, path, ": llm.c header has C ", c.n_embd, " not a multiple of NH ", c.n_head);
  // Sizes in 128 bits: a hostile header may ask for more floats than 64 bits count.
  unsigned __int128 floats = 0;
  for (const LlmcTensor& t : llmc_layout(c)) {
    unsigned __int128 n = t.block_suffix.empty() ? 1 : c.n_layer;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    floats += n;
  }
  const unsigned __int128 want = kHeaderBytes + dtype_size(dtype) * floats;
  CASTOR_CHECK(want == file_size, path, ": llm.c checkpoint is ", file_size, " bytes, its header (maxT ", c.block_size,
               ", V ", c.real_vocab_size, ", L ", c.n_layer, ", NH ", c.n_head, ", C ", c.n_embd, ", Vp ", c.vocab_size,
               ") needs ",
               want > UINT64_MAX ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(want)));
  return {c, dtype};
}

std::vector<std::pair<std::string, Shape>> llmc_tensors(const GPTConfig& c) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const LlmcTensor& t : llmc_layout(c)) {
    if (t.block_suffix.empty()) {
      out.emplace_back(t.name, t.shape);
    } else {
      for (int64_t i = 0; i < c.n_layer; ++i) out.emplace_back(block_name(i, t.block_suffix), t.shape);
    }
  }
  return out;
}

GPTWeights read_llmc_checkpoint(const std::string& path) {
  const LlmcHeader header = read_llmc_header(path);
  const uint64_t elem = dtype_size(header.dtype);
  GPTWeights w{header.config, {}};
  uint64_t file_size = 0, offset = kHeaderBytes;
  read_file_range(path, 0, 0, file_size);
  // One read per llm.c tensor (all layers of a kind together), never the whole file at once.
  for (const LlmcTensor& t : llmc_layout(w.config)) {
    const int64_t layers = t.block_suffix.empty() ? 1 : w.config.n_layer, per = shape_numel(t.shape);
    const std::vector<uint8_t> bytes = read_file_range(path, offset, elem * layers * per, file_size);
    offset += bytes.size();
    auto tensor_at = [&](int64_t i) {
      return from_blob(bytes.data() + elem * i * per, t.shape, header.dtype).to(DType::Float32);
    };
    if (t.block_suffix.empty()) {
      w.state[t.name] = tensor_at(0);
    } else {
      for (int64_t i = 0; i < layers; ++i) w.state[block_name(i, t.block_suffix)] = tensor_at(i);
    }
  }
  return w;
}

void write_llmc_checkpoint(const std::string& path, const GPTWeights& w) {
  const GPTConfig& c = w.config;
  c.validate();
  const std::map<std::string, Shape> shapes = expected_shapes(c);
  for (const auto& [name, shape] : shapes) {
    auto it = w.state.find(name);
    CASTOR_CHECK(it != w.state.end(), path, ": cannot write llm.c checkpoint: no tensor ", name);
    CASTOR_CHECK(it->second.shape() == shape, path, ": cannot write llm.c checkpoint: ", name, " is ",
                 shape_str(it->second.shape()), ", expected ", shape_str(shape));
  }
  int32_t h[256] = {};
  h[0] = kLlmcModelMagic, h[1] = kLlmcModelVersion;
  const int64_t fields[] = {c.block_size, c.real_vocab_size > 0 ? c.real_vocab_size : c.vocab_size,
                            c.n_layer,    c.n_head,
                            c.n_embd,     c.vocab_size};
  for (int i = 0; i < 6; ++i) {
    CASTOR_CHECK(fields[i] <= INT32_MAX, path, ": cannot write llm.c checkpoint: a size exceeds int32");
    h[2 + i] = static_cast<int32_t>(fields[i]);
  }
  std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(h), reinterpret_cast<const uint8_t*>(h) + kHeaderBytes);
  auto append = [&](const std::string& name, const Shape& shape) {
    auto it = w.state.find(name);
    const size_t n = static_cast<size_t>(shape_numel(shape)) * 4;
    if (it == w.state.end()) {  // a bias of a GPT without biases
      bytes.resize(bytes.size() + n, 0);
      return;
    }
    const Tensor t = it->second.detach().to(DType::Float32).contiguous();
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    bytes.insert(bytes.end(), p, p + n);
  };
  for (const auto& [name, shape] : llmc_tensors(c)) append(name, shape);
  atomic_write_file(path, std::span<const uint8_t>(bytes));
}

void write_llmc_checkpoint(const std::string& path, const GPT& model) {
  write_llmc_checkpoint(path, GPTWeights{model.config(), model.state_dict()});
}

GPTWeights gpt_weights_from_state_dict(StateDict state, int64_t n_head, const std::string& what) {
  StateDict sd;
  const std::string compiled = "_orig_mod.";
  for (auto& [key, t] : state) {
    const std::string name = key.rfind(compiled, 0) == 0 ? key.substr(compiled.size()) : key;
    if (ends_with(name, ".attn.bias") && t.dim() == 4) continue;  // nanoGPT's causal-mask buffer
    CASTOR_CHECK(is_floating(t.dtype()), what, ": ", name, " is ", dtype_name(t.dtype()),
                 ", expected a floating-point tensor");
    sd[name] = t.to(DType::Float32).contiguous();
  }
  auto need = [&](const std::string& name, int64_t dims) -> const Tensor& {
    auto it = sd.find(name);
    CASTOR_CHECK(it != sd.end(), what, ": no tensor ", name, " (expected nanoGPT's names)");
    CASTOR_CHECK(it->second.dim() == dims, what, ": ", name, " is ", shape_str(it->second.shape()), ", expected ", dims,
                 " dimensions");
    return it->second;
  };
  GPTConfig c;
  c.vocab_size = need("transformer.wte.weight", 2).size(0);
  c.n_embd = need("transformer.wte.weight", 2).size(1);
  c.block_size = need("transformer.wpe.weight", 2).size(0);
  c.n_layer = 0;
  while (sd.count(block_name(c.n_layer, "ln_1.weight"))) ++c.n_layer;
  CASTOR_CHECK(c.n_layer > 0, what, ": no tensor transformer.h.0.ln_1.weight (expected nanoGPT's names)");
  c.bias = sd.count("transformer.ln_f.bias") > 0;
  CASTOR_CHECK(n_head > 0, what, ": the number of heads is not recorded in the file; give it (--n-head)");
  c.n_head = n_head, c.dropout = 0.0;
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": ", e.what()));
  }
  if (auto it = sd.find("lm_head.weight"); it != sd.end()) {
    const Tensor& wte = sd.at("transformer.wte.weight");
    CASTOR_CHECK(it->second.shape() == wte.shape() &&
                     std::memcmp(it->second.data_ptr(), wte.data_ptr(), wte.numel() * 4) == 0,
                 what, ": lm_head.weight differs from transformer.wte.weight; Castor's GPT ties them");
    sd.erase(it);
  }
  const std::map<std::string, Shape> shapes = expected_shapes(c);
  for (const auto& [name, shape] : shapes) {
    auto it = sd.find(name);
    CASTOR_CHECK(it != sd.end(), what, ": no tensor ", name, " (expected nanoGPT's names)");
    CASTOR_CHECK(it->second.shape() == shape, what, ": ", name, " is ", shape_str(it->second.shape()), ", expected ",
                 shape_str(shape), " for this GPT (n_layer ", c.n_layer, ", n_embd ", c.n_embd, ")");
  }
  for (const auto& [name, t] : sd)
    CASTOR_CHECK(shapes.count(name), what, ": unexpected tensor ", printable(name), " for a GPT with nanoGPT's names");
  return {c, std::move(sd)};
}

GPTWeights gpt_weights_from_safetensors(StateDict tensors, const Metadata& metadata, int64_t n_head,
                                        const std::string& what) {
  int64_t recorded = 0;
  const Json config = formats::castor_config(metadata, what);
  if (const Json* v = config.is_object() ? config.find("n_head") : nullptr; v && v->is_int()) recorded = v->as_int();
  CASTOR_CHECK(n_head == 0 || recorded == 0 || n_head == recorded, what, ": records n_head ", recorded, ", but ",
               n_head, " was given");
  GPTWeights w = gpt_weights_from_state_dict(std::move(tensors), recorded > 0 ? recorded : n_head, what);
  // The vocabulary the model was made for, when a Castor run recorded it (its padded rows are not tokens).
  if (const Json* v = config.is_object() ? config.find("real_vocab_size") : nullptr;
      v && v->is_int() && v->as_int() > 0 && v->as_int() <= w.config.vocab_size)
    w.config.real_vocab_size = v->as_int();
  return w;
}

GPTWeights load_gpt_init(const std::string& path, int64_t n_head) {
  const formats::SourceFormat format = formats::source_format(path);
  CASTOR_CHECK(format == formats::SourceFormat::Llmc || format == formats::SourceFormat::Safetensors, path, ": a ",
               formats::source_format_row(format).help, ", not a GPT's weights (llm.c's, or safetensors)");
  if (format == formats::SourceFormat::Llmc) {
    GPTWeights w = read_llmc_checkpoint(path);
    CASTOR_CHECK(n_head == 0 || n_head == w.config.n_head, path, ": llm.c header has NH ", w.config.n_head, ", but ",
                 n_head, " was given");
    return w;
  }
  LoadedTensors file = load_safetensors(path);
  return gpt_weights_from_safetensors(std::move(file.tensors), file.metadata, n_head, path);
}

}  // namespace castor::formats
