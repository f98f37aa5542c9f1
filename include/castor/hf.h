// Hugging Face model directories of the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM):
// config.json and model.safetensors, or shards listed by model.safetensors.index.json, to and from Castor's Llama
// (docs/hugging-face.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "castor/formats.h"
#include "castor/json.h"
#include "castor/llama.h"
#include "castor/nn.h"
#include "castor/safetensors.h"
#include "castor/state_dict.h"

namespace castor::formats {

// Whether `path` is a directory holding config.json and model.safetensors, its index or pytorch_model.bin (a Castor
// run directory, which holds a config.json too, is not).
bool is_hf_dir(const std::string& path);

// What a directory's config.json describes.
struct HfConfig {
  models::LlamaConfig llama;            // hidden_dim set (intermediate_size), max_seq_len the positions it runs at
  std::string architecture;             // "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM"
  Json bos, eos;                        // bos_token_id, eos_token_id as written (a number, a list or null)
  DType dtype = DType::Float32;         // torch_dtype (v5: dtype), float32 when absent
  int64_t max_position_embeddings = 0;  // as written (llama.max_seq_len: the same)
};
// Reads DIR/config.json: every key of the three architectures (transformers v5's rope_parameters, dtype and
// layer_types too) as their modelling files compute them: head_dim, Llama's attention_bias and mlp_bias, Qwen2's
// q/k/v biases, rope scaling of type linear and llama3, Mistral's sliding_window (every layer; 4096 when absent) and
// Qwen2's (with use_sliding_window, layers max_window_layers and up). castor::Error, one line naming the file and the
// key, for an unknown architecture, a pickle-only directory (pytorch_model.bin: how to convert it) and a key whose
// value changes the math in a way Castor's Llama does not compute (another rope type, an activation other than silu,
// quantization, logit soft-capping, partial rotary). Then every tensor it describes is checked against DIR's
// safetensors headers (present, its shape, a float dtype) before anything is made from its sizes: one line naming
// config.json and the key (num_hidden_layers past the layers the tensors hold; a shape's keys) or the file and tensor.
HfConfig read_hf_config(const std::string& dir);
// The same without the tensors: config.json's keys alone.
HfConfig parse_hf_config(const std::string& dir);

// The description of config's model a run records (castor/formats.h's llama_description with "architecture",
// "bos_token_id" and "eos_token_id"), and the model settings a run of it on `data` (a --data name; "": none) records in a
// model file's metadata ("castor.config": model llama, its sizes, block_size its context up to kDefaultWindow,
// model_config; "hf.architecture").
Json hf_description(const HfConfig& config);
Metadata hf_metadata(const HfConfig& config, const std::string& data);

// The tensors of DIR (model.safetensors, or the shards model.safetensors.index.json lists), renamed to Castor's
// Llama names (hf_layout) with q_proj and k_proj rows permuted from Hugging Face's rotary pairs (i, i + d/2) to
// Castor's interleaved ones (2i, 2i + 1) exactly, each converted to `dtype` as it is read (the file's float32,
// float16 or bfloat16 bytes: one tensor in memory besides the result at a time). output.weight is
// tok_embeddings.weight's tensor when the embedding is tied. castor::Error naming the file and the tensor for a
// missing shard or tensor, a shape other than config.json's, a dtype other than those three, a truncated file.
StateDict read_hf_weights(const std::string& dir, const HfConfig& config, DType dtype = DType::Float32);
// The same checks, then each tensor given to `take` (Castor's name, the tensor in the file's dtype) as it is read and
// dropped after it: a model loads tensor by tensor, never holding a second copy of its weights (output.weight is not
// given when tied; models::load_weights_into loads a model so).
void read_hf_weights_each(const std::string& dir, const HfConfig& config,
                          const std::function<void(const std::string&, const Tensor&)>& take);
// The names (Castor's), dtypes and shapes of DIR's tensors, reading only the headers (castor info).
SafetensorsFile read_hf_header(const std::string& dir);

struct HfWriteOptions {
  uint64_t max_shard_bytes = 5'000'000'000;  // past this, shards named model-0000K-of-0000N.safetensors + index
  std::string architecture = "LlamaForCausalLM";
  Json bos = Json(1), eos = Json(2);
  int64_t max_position_embeddings = 0;  // 0: the model's max_seq_len
  std::string tokenizer_dir;            // a Hugging Face directory whose tokenizer files are copied ("": none)
};
// Writes DIR: config.json (options.architecture's keys: Llama's attention_bias and mlp_bias, Mistral's sliding_window,
// Qwen2's use_sliding_window and max_window_layers; rope_scaling; castor::Error naming DIR, nothing written, when the
// architecture does not compute `config`: Qwen2 for a model without q/k/v biases, Llama for one with them, a window
// Llama has not), generation_config.json, model.safetensors or shards with model.safetensors.index.json
// (tensors in their dtype, q and k rows permuted back), and the tokenizer files of options.tokenizer_dir. The
// directory is written whole (castor/fs.h's write_output_dir): an existing DIR is replaced only when every entry in
// it is a file this writes (is_hf_export_file; never a Castor run directory or a symbolic link), and a failure leaves
// it as it was. castor::Error naming DIR ("--out").
void write_hf(const std::string& dir, const models::LlamaConfig& config, const StateDict& state,
              const HfWriteOptions& options);
// Whether `name` is a file write_hf writes (config.json, generation_config.json, model.safetensors, its shards and
// index, the tokenizer files): a directory holding anything else is not replaced.
bool is_hf_export_file(const std::string& name);

// Rows of a (rows, ...) tensor's bytes moved between Hugging Face's rotary layout, in which head h's row h d + e
// (d/2) + p pairs with its partner p + d/2, and Castor's interleaved one, in which it is row h d + 2 p + e
// (convert_llama_weights_to_hf.py's permute and its inverse: a pure reordering of rows, exact in any dtype; GGUF's
// qwen2 arch keeps Hugging Face's layout).
Tensor permute_rows(const Tensor& t, int64_t heads, bool to_castor);

// The Llama layout: each Castor tensor name and its Hugging Face name.
const std::vector<TensorName>& hf_layout();

// A LoRA run's adapters (nn::lora_state_dict's "<path>.lora_A.weight" (r, in), "<path>.lora_B.weight" (out, r)) as
// PEFT names them on the Hugging Face model and back (to_castor): each path renamed by hf_layout, and the lora_B rows
// of q_proj and k_proj (their weights' output rows) permuted as those weights' are (lora_A's columns are the input's:
// none), so that PEFT's merge W + s B A of the Hugging Face model is Castor's merged weight in Hugging Face's layout.
// A name config `c` has no weight for stays as it is (the caller reports it as an adapter the model has not).
StateDict hf_adapters(const models::LlamaConfig& c, const StateDict& adapters, bool to_castor);
// A target_modules name, the last part of an adapted layer's path, in the other naming ("wq" <-> "q_proj", "output"
// <-> "lm_head"); a name hf_layout has not (a regex, "all-linear") stays as it is.
std::string hf_target_name(const std::string& name, bool to_castor);

}  // namespace castor::formats
