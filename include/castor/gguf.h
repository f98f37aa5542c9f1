// GGUF files (ggml's format, version 3, which llama.cpp and ollama run): a Castor Llama as arch `llama`, a GPT as arch
// `gpt2`, with the run's tokenizer, in float32, float16, bfloat16 or ggml's quantized blocks mixed per tensor as
// llama-quantize mixes them (docs/fine-tuning.md, "GGUF").
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "castor/formats.h"
#include "castor/json.h"
#include "castor/llama.h"
#include "castor/llmc.h"
#include "castor/model_source.h"
#include "castor/quant.h"
#include "castor/safetensors.h"
#include "castor/serialize.h"
#include "castor/tokenizer.h"

namespace castor::formats {

// How a llama-quantize mix picks the layers (of n) whose tensor takes more bits (src/llama-quant.cpp): never, every
// layer, use_more_bits (the first and last eighth and every third between), the first 2 or 4, the first n/8 or n/16,
// or every layer of a model with 4 or more query heads per key-value head.
enum class GgufPick { Never, Always, MoreBits, FirstTwo, FirstFour, FirstEighth, FirstSixteenth, Gqa4 };
struct GgufMixRule {
  GgufPick pick = GgufPick::Never;
  quant::BlockType yes = quant::BlockType::F32, no = quant::BlockType::F32;  // F32: the file's base type
};

// A GGUF file's type (llama.cpp's llama_ftype, named as llama-quantize names it, in lower case): its matrices' block
// type and llama-quantize's per-tensor mix without an importance matrix. One row per --type (gguf_file_types()).
struct GgufFileType {
  const char* name;                           // "q4_k_m"
  uint32_t ftype;                             // general.file_type
  quant::BlockType base;                      // the matrices' type
  GgufMixRule attn_v, ffn_down, attn_output;  // attn_v: also a GPT's attn_qkv, as llama-quantize counts it
};
std::span<const GgufFileType> gguf_file_types();
// The row named `name` (llama-quantize's aliases q3_k, q4_k and q5_k: q3_k_m, q4_k_m, q5_k_m), or null.
const GgufFileType* find_gguf_file_type(std::string_view name);
// --type's spellings, the table's names and the aliases.
std::vector<std::string> gguf_file_type_names();

// What llama-quantize's mixes look at in a model: its layers, query and key-value heads, whether the output head is
// the token embedding (tied: token_embd takes the output's type), and whether llama.cpp sizes it 70B (80 layers;
// llama: with grouped key-value heads), whose attn_v takes Q5_K for Q3_K or Q4_K.
struct GgufModelShape {
  int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0;
  bool tied = false, is_70b = false;
};
// The type llama-quantize gives tensor `name` (GGUF's name, "blk.3.attn_v.weight") of ggml dims `ne` (ne[0] the row
// width) in a file of `type` made from a float file: 1-D tensors float32, norms and positional embeddings not
// quantized; the output head (and a tied token_embd) Q6_K, or Q8_0 when its rows are not whole blocks or the file is
// Q8_0; attn_v, ffn_down and attn_output by the row's rules; then the fallback of a row width that is not a
// multiple of the type's block (Q2_K and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; F16 when that does
// not fit either).
quant::BlockType gguf_tensor_type(const GgufFileType& type, const std::string& name, const std::vector<int64_t>& ne,
                                  const GgufModelShape& shape);

// llama.cpp's names of a Castor Llama's tensors (arch llama and qwen2: convert_hf_to_gguf.py's), "{i}" the layer, each
// weight followed by its bias: what write_gguf_llama writes and read_gguf_each reads.
const std::vector<TensorName>& gguf_llama_layout();
// llama.cpp's names of a Castor GPT's tensors (arch gpt2), "{i}" the layer, each weight followed by its bias.
const std::vector<TensorName>& gguf_gpt_layout();
// Llama 3.1's per-pair rope factors (llama.cpp's rope_freqs table): no tensor of the model, its rope scaling.
inline constexpr const char* kGgufRopeFreqs = "rope_freqs.weight";

// A tokenizer as GGUF's tokenizer.ggml.* keys hold it: "llama" (SentencePiece-style: tokens with U+2581 for a space,
// scores, token types, byte tokens <0xHH>) for a llama2.c vocabulary, "gpt2" (byte-level BPE: tokens, types, merges
// "a b", pre-tokenizer "gpt-2") for GPT-2's.
struct GgufVocabulary {
  std::string model, pre;
  std::vector<std::string> tokens, merges;
  std::vector<float> scores;   // empty for gpt2
  std::vector<int32_t> types;  // llama.cpp's: 1 normal, 2 unknown, 3 control, 6 byte
  int64_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
  bool add_bos = false, add_space_prefix = false;
  std::string chat_template;  // tokenizer.chat_template (Jinja), when the run's data has one
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// The vocabulary of a token directory's tokenizer (`dir` holds GPT-2's encoder.json and vocab.bpe for a gpt2 one),
// with the chat template, end-of-sequence, end-of-turn and padding ids its record (castor_tokens.json) holds (chat
// data: castor tokenize --format chat). A Hugging Face tokenizer.json (a model directory, or a token directory made
// with one): byte-level BPE as "gpt2" with tokenizer.ggml.pre "llama-bpe" (Llama 3's split) or "qwen2" (Qwen2's),
// SentencePiece-style BPE as "llama" with scores from the merge ranks, the special ids and template of
// tokenizer_config.json (castor/chat_data.h's chat_tokenizer), padded with unused "[PADn]" tokens to `size` (the
// model's vocabulary; 0: the tokenizer's). castor::Error naming `dir` for a character vocabulary, which neither GGUF
// tokenizer can express.
GgufVocabulary gguf_vocabulary(const data::Tokenizer& tok, const std::string& dir, int64_t size = 0);

// What a GGUF write produced, for the export summary.
struct GgufSummary {
  std::string arch;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  double max_error = 0;  // the largest |x - dequantized x| over the quantized matrices (0 for float files)
  std::map<std::string, int64_t> tensor_types;  // ggml's type name ("q6_K") -> the number of tensors of that type
};

// The GGUF arch of a model: llama, or qwen2 (Qwen2ForCausalLM: q/k/v biases, NEOX rope) for the Llama family; gpt2
// for a GPT (write_gguf_gpt's, and its adapters').
enum class GgufArch { Llama, Qwen2, Gpt2 };
// Writes `path` whole (atomic_write_file) as `arch`. llama: the model's rows of wq and wk are llama2.c's interleaved
// RoPE layout, which is llama.cpp's for this arch; llama3 rope scaling as llama.cpp's rope_freqs table. qwen2: the
// same keys under qwen2.*, wq's and wk's rows and biases permuted back to Hugging Face's rotate-half layout (as
// convert_hf_to_gguf.py's Qwen2Model leaves them). castor::Error, nothing written, when the vocabulary's size is not
// the model's, or qwen2 gets a model without q/k/v biases, with other biases or llama3 rope scaling.
// `context_length`: the model's context (a Hugging Face model's max_position_embeddings, where a fine-tuning run's
// model reads its shorter block size); 0: the model's max_seq_len.
GgufSummary write_gguf_llama(const std::string& path, const models::Llama& model, const GgufVocabulary& vocab,
                             const GgufFileType& type, const std::string& name, GgufArch arch = GgufArch::Llama,
                             int64_t context_length = 0);
// Writes `path` as llama.cpp's LoRA adapter of a model of `arch` (convert_lora_to_gguf.py's file, which
// src/llama-adapter.cpp reads): general.type "adapter", adapter.type "lora", adapter.lora.alpha `alpha` (llama.cpp
// scales B A by alpha / r), and for each "<path>.lora_A.weight" (r, in) / "<path>.lora_B.weight" (out, r) of
// `adapters` (Castor's names: nn::lora_state_dict) "<GGUF weight name>.lora_a" of ggml dims [in, r] and ".lora_b" of
// [r, out] (gguf_llama_layout's or gguf_gpt_layout's names); qwen2's q/k lora_b rows in the base file's order (`c`:
// the Llama's heads; unused for gpt2). --type f32, f16, bf16 or q8_0 (lora_b F16 where r is no
// whole number of 32-value blocks); castor::Error otherwise, or for an adapter of a weight llama.cpp's arch has not.
GgufSummary write_gguf_lora(const std::string& path, const models::LlamaConfig& c, GgufArch arch,
                            const StateDict& adapters, double alpha, const GgufFileType& type, const std::string& name);
// Writes `path` as arch `gpt2`: the embedding cut to the vocabulary's rows (a padded vocabulary's extra rows are never
// drawn), zero biases for a bias-free model (llama.cpp's gpt2 requires them).
GgufSummary write_gguf_gpt(const std::string& path, const GPTWeights& weights, const GgufVocabulary& vocab,
                           const GgufFileType& type, const std::string& name);

// ---- Reading (GGUF v3 of arch llama, which Mistral's files use too, and qwen2) ----

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32

// One tensor info of a file: its name, ggml's dims (innermost first: a Linear's [in, out]), ggml type id, and where
// its bytes lie (from the start of the file).
struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t begin = 0, bytes = 0;
};
// A file's header: its key-value pairs (scalars as Json numbers, bools and strings; arrays as Json arrays) and tensor
// infos, every field checked against the file (one-line castor::Error naming the file and the field: a truncated
// file, a version other than 2 or 3, a string or array longer than the rest of the file, a duplicate key or tensor
// name, more than 4 dims or dims whose product overflows, an unknown value or tensor type, an offset not a multiple of
// general.alignment or data past the end).
struct GgufHeader {
  uint32_t version = 0;
  std::map<std::string, Json> kv;
  std::vector<GgufTensorInfo> tensors;
  const Json* find(const std::string& key) const {
    const auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  }
};
GgufHeader read_gguf_header(const std::string& path);

// ggml's name of a tensor type id ("q4_K"), or "" for an id it has not.
std::string ggml_type_name(uint32_t type);

// The model a llama or qwen2 file holds, as runs describe it (castor/formats.h's llama_description with
// "architecture" LlamaForCausalLM or Qwen2ForCausalLM, "bos_token_id" and "eos_token_id"); castor::Error naming the
// file and the key for another architecture, a missing size, or a key whose value changes the math in a way
// Castor's Llama does not compute (experts, soft-capping, a partial rotary, rope scaling other than linear, per-pair
// rope factors, a sliding window).
Json gguf_description(const GgufHeader& header, const std::string& path);
// "" for a file of dense tensors only; else the quantized types it holds (tensors of each, ggml's names) and what
// Castor does with them: a LoRA run and castor sample / eval keep a Linear's in their blocks, full fine-tuning
// dequantizes them to float32 trainable weights.
std::string gguf_quantized_note(const GgufHeader& header);
// The model settings a run of it on `data` would record (as castor/hf.h's hf_metadata), and "gguf.architecture"; no
// precision (a file of another tool: castor eval runs it in float32).
Metadata gguf_metadata(const GgufHeader& header, const std::string& path, const std::string& data);
// Castor's names, dtypes and shapes of the file's tensors (their data not read; a quantized type's as float32), and
// in the metadata "gguf.quantized" (gguf_quantized_note) when the file holds quantized matrices.
SafetensorsFile gguf_listing(const GgufHeader& header, const std::string& path);
// Each tensor read (Castor's name; F32, F16 and BF16 as they are stored, every quantized type's blocks dequantized to
// float32 through the block-type table, castor/quant.h; qwen2's q/k rows and biases permuted to Castor's interleaved
// rotary layout) and given to `take`, then dropped; or, for a matrix of a quantized type whose name `blocks.wants`,
// its blocks as the file stores them ((rows, cols), qwen2's q/k rows moved whole) given to `blocks.take`, never
// dequantized. castor::Error naming the file and the tensor for a tensor the architecture has not, or a shape other
// than the description's.
void read_gguf_each(const std::string& path, const std::function<void(const std::string&, const Tensor&)>& take,
                    const BlocksTake& blocks = {});

// The tokenizer a file's tokenizer.ggml.* keys describe, as a Hugging Face tokenizer.json (Castor's Tokenizer reads
// that): "gpt2" with pre "llama-bpe" (Llama 3's split), "qwen2", "gpt-2" or "default" as byte-level BPE with the
// merges; "llama" (SentencePiece) as BPE with byte fallback and the file's scores (model.gguf_scores: Castor merges
// as llama.cpp does, the adjacent pair whose concatenation is a token of the highest score first, the leftmost of
// equal scores), with merges of two normal tokens ranked by those scores for other readers of tokenizer.json;
// control and user-defined tokens as added tokens,
// add_bos_token as a BOS template. The chat template, bos, eos, eot and pad ids as tokenizer_config.json would hold
// them. castor::Error naming the file and the key for another tokenizer model or pre-tokenizer.
struct GgufTokenizer {
  std::string tokenizer_json, tokenizer_config_json;
};
GgufTokenizer gguf_tokenizer(const GgufHeader& header, const std::string& path);
// A directory holding gguf_tokenizer's files as tokenizer.json and tokenizer_config.json (a Hugging Face model
// directory's tokenizer, which Castor's Tokenizer, chat templates and castor tokenize read): made once per content
// under the system's temporary directory (named by the files' checksum, written whole, then renamed into place).
std::string gguf_tokenizer_dir(const std::string& path);

}  // namespace castor::formats
