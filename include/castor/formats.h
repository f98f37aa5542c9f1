// What the file-format readers and writers (src/formats: llm.c, llama2.c, Hugging Face) share: the run settings
// Castor records in a model file's metadata, and the tensor-name table each format's layout is written as.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "castor/json.h"
#include "castor/llama.h"
#include "castor/models.h"
#include "castor/serialize.h"

namespace castor::formats {

// The run settings a model file's castor.config metadata records: a JSON object, or null when there is none.
// castor::Error naming `what` (the file) when the metadata is not a JSON object.
Json castor_config(const Metadata& meta, const std::string& what);

// castor::Error naming `what` (the file) and the tensor `name` when `t` holds NaN or infinite values: weights read
// from a file are checked as they load, so that a damaged file is named as such, not as a run that diverged or an
// evaluation of accuracy 0.
void check_finite(const std::string& what, const std::string& name, const Tensor& t);

// A Llama's description as runs record it (config.json's "model_config": "family" "llama" and LlamaConfig's fields,
// hidden_dim resolved), and the LlamaConfig of one (castor::Error naming `what` and a missing or invalid field; keys
// it does not know, such as a Hugging Face directory's "architecture", "bos_token_id" and "eos_token_id", are kept
// by whoever wrote them).
Json llama_description(const models::LlamaConfig& l);
models::LlamaConfig llama_config(const Json& description, const std::string& what);
// The positions a run of another tool's model (a Hugging Face directory, a GGUF file) reads at once when no
// --block-size says: its context, at most 2048, lm-evaluation-harness's default max_length (a Llama 3's 131,072 is
// neither a training block nor an evaluation window a CPU runs; the model's context stays the description's).
inline constexpr int64_t kDefaultWindow = 2048;
// The settings a run of another tool's Llama `l` records (castor.config: "model" llama, Castor's size flags,
// block_size its context up to kDefaultWindow, "model_config" `description`, and "data" when `data` is not ""); no
// precision (castor eval runs such a file in float32).
Json llama_settings(const models::LlamaConfig& l, const Json& description, const std::string& data);
// A GPT's: "family" "gpt", n_layer, n_head, n_embd, block_size, vocab_size, bias, dropout.
Json gpt_description(const models::GPTConfig& g);
models::GPTConfig gpt_config(const Json& description, const std::string& what);

// One row of a format's layout: a tensor's Castor name and its name in the file, "{i}" standing for the layer
// index in both ("layers.{i}.attention.wq.weight" <-> "model.layers.{i}.self_attn.q_proj.weight").
struct TensorName {
  const char* castor;
  const char* file;
};
// The name `castor_name` has in the file under `layout` ("{i}" filled in), or "" when the layout has no row for it.
std::string file_name(const std::vector<TensorName>& layout, const std::string& castor_name);
// The Castor name of the file's tensor `file_name` under `layout` (the layout read backwards), or "" when none.
std::string castor_name(const std::vector<TensorName>& layout, const std::string& file_name);

}  // namespace castor::formats
