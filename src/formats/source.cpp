// The table of model formats and the reading every command shares (castor/model_source.h): one place decides what a
// path holds, and each format's reader is reached through it.
#include "castor/model_source.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "castor/autograd.h"
#include "castor/formats.h"
#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/hf.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"

namespace castor::formats {
namespace {

namespace fs = std::filesystem;

// The first `n` bytes of a regular file (fewer when it is shorter; none for anything else).
std::vector<uint8_t> file_head(const std::string& path, uint64_t n) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return {};
  uint64_t size = 0;
  read_file_range(path, 0, 0, size);
  return read_file_range(path, 0, std::min(size, n), size);
}

uint32_t head_u32(const std::vector<uint8_t>& head) {
  uint32_t v = 0;
  if (head.size() >= 4) std::memcpy(&v, head.data(), 4);
  return v;
}

bool holds_castor_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && !is_hf_dir(path);
}

bool holds_gguf(const std::string& path) { return head_u32(file_head(path, 4)) == formats::kGgufMagic; }

bool holds_llmc(const std::string& path) {
  return static_cast<int32_t>(head_u32(file_head(path, 4))) == formats::kLlmcModelMagic;
}

// A little-endian u64 header length that fits the file, then the JSON header, which opens with '{'.
bool holds_safetensors(const std::string& path) {
  const std::vector<uint8_t> head = file_head(path, 9);
  if (head.size() < 9) return false;
  uint64_t size = 0, header_len = 0;
  read_file_range(path, 0, 0, size);
  std::memcpy(&header_len, head.data(), 8);
  return header_len >= 2 && header_len <= size - 8 && head[8] == '{';
}

// v1's magic number, or a v0 header whose sizes give exactly the file's size.
bool holds_llama2c(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  if (head_u32(file_head(path, 4)) == formats::kLlama2cMagic) return true;
  try {
    formats::read_llama2c_header(path);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

const std::vector<SourceFormatRow>& source_formats() {
  static const std::vector<SourceFormatRow> table = {
      {SourceFormat::CastorDir, "castor", "a Castor run or checkpoint directory (castor train --out)",
       holds_castor_dir},
      {SourceFormat::HfDir, "hf",
       "a Hugging Face model directory (config.json and model.safetensors, or shards with their index)", is_hf_dir},
      {SourceFormat::Gguf, "gguf", "a GGUF file (version 3: llama.cpp's and ollama's)", holds_gguf},
      {SourceFormat::Llmc, "llmc", "an llm.c checkpoint (gpt2_124M.bin)", holds_llmc},
      {SourceFormat::Safetensors, "safetensors",
       "a safetensors file (castor export --safetensors's, or nanoGPT's names)", holds_safetensors},
      {SourceFormat::Llama2c, "llama2c", "a llama2.c model.bin (v0 or v1)", holds_llama2c},
  };
  return table;
}

const SourceFormatRow& source_format_row(SourceFormat format) {
  for (const SourceFormatRow& row : source_formats())
    if (row.format == format) return row;
  CASTOR_ASSERT(false, "a source format without a row");
  return source_formats().front();
}

SourceFormat source_format(const std::string& path) {
  std::error_code ec;
  CASTOR_CHECK(fs::exists(path, ec), path, ": no such file or directory");
  for (const SourceFormatRow& row : source_formats())
    if (row.holds(path)) return row.format;
  // (every row said no: say what reading it as the one format without a magic number found)
  std::string why = "not a regular file";
  if (fs::is_regular_file(path, ec)) try {
      formats::read_llama2c_header(path);
    } catch (const Error& e) {
      const std::string msg = e.what(), prefix = path + ": ";
      why = msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
    }
  throw Error(detail::cat(path,
                          ": not a model file (no GGUF, safetensors, llm.c or llama2.c v1 header at its start; as a "
                          "llama2.c v0 file: ",
                          why, ")"));
}

bool is_source(const std::string& path, SourceFormat format) {
  std::error_code ec;
  return fs::exists(path, ec) && source_format_row(format).holds(path);
}

Json source_description(const std::string& path) {
  switch (source_format(path)) {
    case SourceFormat::HfDir: return hf_description(read_hf_config(path));
    case SourceFormat::Gguf: return formats::gguf_description(formats::read_gguf_header(path), path);
    case SourceFormat::Llmc: return gpt_description(formats::read_llmc_header(path).config);
    case SourceFormat::Llama2c: {
      const formats::Llama2cHeader h = formats::read_llama2c_header(path);
      return llama_description(formats::llama_config(formats::Llama2cWeights{h.config, {}}));
    }
    case SourceFormat::Safetensors: {
      const Json config = castor_config(read_safetensors_header(path).metadata, path);
      const Json* d = config.is_object() ? config.find("model_config") : nullptr;
      return d && d->is_object() ? *d : Json();
    }
    case SourceFormat::CastorDir: return Json();
  }
  return Json();
}

LoadedTensors load_weights_file(const std::string& path, const std::string& data) {
  switch (source_format(path)) {
    case SourceFormat::HfDir: {
      const HfConfig h = read_hf_config(path);
      return {read_hf_weights(path, h), hf_metadata(h, data)};
    }
    case SourceFormat::Gguf: {
      LoadedTensors out;
      read_weights_each(path, [&](const std::string& name, const Tensor& t) { out.tensors.emplace(name, t); });
      out.metadata = formats::gguf_metadata(formats::read_gguf_header(path), path, data);
      return out;
    }
    case SourceFormat::Llama2c: return formats::load_llama2c_weights_file(path, data);
    case SourceFormat::Llmc: {
      const formats::LlmcHeader header = formats::read_llmc_header(path);
      formats::GPTWeights w = formats::read_llmc_checkpoint(path);
      w.state["lm_head.weight"] = w.state.at("transformer.wte.weight");
      return {std::move(w.state), formats::llmc_metadata(header, data)};
    }
    case SourceFormat::Safetensors:
    case SourceFormat::CastorDir:  // (load_safetensors names a directory as not a file)
      break;
  }
  return load_safetensors(path);
}

void read_weights_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take,
                       const BlocksTake& blocks) {
  const SourceFormat format = source_format(path);
  if (format == SourceFormat::HfDir) return read_hf_weights_each(path, read_hf_config(path), take);
  if (format == SourceFormat::Gguf) return formats::read_gguf_each(path, take, blocks);
  if (format == SourceFormat::Llama2c) {
    for (const auto& [name, t] : formats::load_llama2c_weights_file(path, "").tensors) take(name, t);
    return;
  }
  const SafetensorsFile header = read_weights_header(path);  // (an llm.c file's tensors, per layer, as listed)
  uint64_t size = 0, end = 0;
  read_file_range(path, 0, 0, size);
  for (const SafetensorsEntry& e : header.entries) end = std::max(end, e.end);
  for (const SafetensorsEntry& e : header.entries) {
    Tensor x = empty(Shape(e.shape.begin(), e.shape.end()), e.dtype);
    read_file_range_into(path, size - end + e.begin,
                         std::span<uint8_t>(static_cast<uint8_t*>(x.data_ptr()), x.nbytes()), size);
    take(e.name, x);
  }
}

namespace {

// The layers a file's blocks may go to (each Linear and Embedding), by their weights' names; a weight tied to another
// tensor is left dense.
using BlocksTarget = std::function<void(std::shared_ptr<const quant::QuantizedMatrix>)>;
void collect_block_targets(nn::Module& m, const std::string& prefix, const std::map<const void*, int>& uses,
                           std::map<std::string, BlocksTarget>& out) {
  for (const auto& [name, child] : m.named_children()) {
    const std::string path = prefix + name;
    if (auto linear = std::dynamic_pointer_cast<nn::Linear>(child)) {
      if (linear->weight.defined() && uses.at(linear->weight.data_ptr()) == 1)
        out.emplace(path + ".weight", [linear](auto q) { linear->take_blocks(std::move(q)); });
    } else if (auto embedding = std::dynamic_pointer_cast<nn::Embedding>(child)) {
      if (embedding->weight.defined() && uses.at(embedding->weight.data_ptr()) == 1)
        out.emplace(path + ".weight", [embedding](auto q) { embedding->take_blocks(std::move(q)); });
    } else {
      collect_block_targets(*child, path + ".", uses, out);
    }
  }
}
std::map<std::string, BlocksTarget> block_targets(nn::Module& model, const StateDict& own) {
  std::map<const void*, int> uses;
  for (const auto& [name, t] : own) ++uses[t.data_ptr()];
  std::map<std::string, BlocksTarget> out;
  collect_block_targets(model, "", uses, out);
  return out;
}

// The model's own tensor that `t` (a state_dict entry: a detached view) shares its memory with.
Tensor owner(nn::Module& model, const Tensor& t) {
  for (const auto& [name, p] : model.named_parameters())
    if (p.data_ptr() == t.data_ptr()) return p;
  CASTOR_ASSERT(false, "a placeholder that is no parameter of the model");
  return t;
}

}  // namespace

void load_weights_into(nn::Module& model, const std::string& path,
                       const std::function<void(const std::string& name)>& filled, bool keep_blocks) {
  StateDict own = model.state_dict();
  std::set<const void*> loaded;  // the storages given, by address (a tied tensor's names share one)
  NoGradGuard no_grad;
  const std::string compiled = "_orig_mod.";
  std::map<const void*, Tensor> given_memory;  // placeholders filled, by their memory before (a tied name's too)
  std::map<const void*, int> names_left;       // names not given yet, by memory (a tied tensor's names share one)
  for (const auto& [name, t] : own) ++names_left[t.data_ptr()];
  BlocksTake blocks;
  std::map<std::string, BlocksTarget> targets;
  if (keep_blocks) targets = block_targets(model, own);
  blocks.wants = [&](const std::string& name) { return targets.count(name) > 0; };
  blocks.take = [&](const std::string& name, const std::shared_ptr<const quant::QuantizedMatrix>& q) {
    try {
      targets.at(name)(q);
    } catch (const Error& e) {
      throw Error(detail::cat(path, ": ", name, ": ", e.what()));
    }
    loaded.insert(own.at(name).data_ptr());
    own.at(name) = Tensor();  // (not held here either)
  };
  read_weights_each(
      path,
      [&](const std::string& key, const Tensor& t) {
        const std::string name = key.rfind(compiled, 0) == 0 ? key.substr(compiled.size()) : key;
        const auto it = own.find(name);
        if (it == own.end() && name.ends_with(".attn.bias") && t.dim() == 4) return;  // nanoGPT's causal mask
        CASTOR_CHECK(it != own.end(), path, ": the model has no tensor ", printable(name));
        CASTOR_CHECK(it->second.shape() == t.shape(), path, ": ", name, " has shape ", shape_str(t.shape()),
                     ", the model's is ", shape_str(it->second.shape()));
        check_finite(path, name, t);
        Tensor dst = it->second;
        const void* memory = dst.data_ptr();
        bool taken = false;             // (the placeholder took t's memory: nothing to copy)
        if (nn::is_placeholder(dst)) {  // (its memory given in the model's own tensor, which a tied one shares)
          auto [at, fresh] = given_memory.try_emplace(dst.data_ptr());
          if (fresh) {
            at->second = owner(model, dst);
            taken = nn::fill_placeholder(at->second, t);
          }
          dst = at->second;
        }
        if (!taken) dst.copy_(t);
        loaded.insert(memory);
        dst = Tensor();
        if (filled) {
          filled(name);
          it->second = Tensor();  // (the model may have dropped the tensor: it is not held here either)
        }
        // The last name of a filled placeholder: the model holds it now, or has dropped it (a weight quantized as it
        // was filled), so the bf16 base is never whole here.
        if (--names_left.at(memory) == 0) given_memory.erase(memory);
      },
      blocks);
  for (const auto& [name, t] : own) CASTOR_CHECK(!t.defined() || loaded.count(t.data_ptr()), path, ": gives no ", name);
}

SafetensorsFile read_weights_header(const std::string& path) {
  switch (source_format(path)) {
    case SourceFormat::HfDir: return read_hf_header(path);
    case SourceFormat::Gguf: return formats::gguf_listing(formats::read_gguf_header(path), path);
    case SourceFormat::Llama2c: return formats::read_llama2c_weights_header(path);
    case SourceFormat::Llmc: {
      const formats::LlmcHeader header = formats::read_llmc_header(path);
      SafetensorsFile f;
      uint64_t offset = 0;
      for (const auto& [name, shape] : formats::llmc_tensors(header.config)) {
        const uint64_t bytes = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(header.dtype);
        f.entries.push_back({name, header.dtype, shape, offset, offset + bytes});
        offset += bytes;
      }
      f.metadata = formats::llmc_metadata(header, "");
      return f;
    }
    case SourceFormat::Safetensors:
    case SourceFormat::CastorDir: break;
  }
  return read_safetensors_header(path);
}

}  // namespace castor::formats
