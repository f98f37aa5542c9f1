// What the file-format readers and writers (src/formats: llm.c, llama2.c, Hugging Face) share: the run settings
// Castor records in a model file's metadata, and the tensor-name table each format's layout is written as.
#pragma once
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

}  // namespace castor::formats
