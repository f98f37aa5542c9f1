// GGUF files (ggml's format, version 3, which llama.cpp and ollama run): a Castor Llama as arch `llama`, a GPT as arch
// `gpt2`, with the run's tokenizer, in float32, float16, bfloat16 or ggml's Q8_0 blocks (docs/fine-tuning.md, "GGUF").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "castor/llama.h"
#include "castor/llmc.h"
#include "castor/tokenizer.h"

namespace castor::models {

// The type of a GGUF file's matrices (1-D tensors, norms and biases, stay float32 in every file, as llama.cpp's
// converter writes them): --type's spellings f32, f16, bf16 and q8_0.
enum class GgufType { F32, F16, BF16, Q8_0 };

// ggml's Q8_0 (ggml-quants.c, quantize_row_q8_0_ref): per block of 32 values, d = max|x| / 127 stored as float16,
// then int8 q = roundf(x * (1 / d)) (0 when d is 0); 34 bytes a block. x.size() must be a multiple of 32.
std::vector<uint8_t> quantize_q8_0(std::span<const float> x);
// ggml's dequantize_row_q8_0: q * float(d), in float32.
std::vector<float> dequantize_q8_0(std::span<const uint8_t> blocks);

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
  double q8_0_max_error = 0;  // the largest |x - dequantized x| over the Q8_0 matrices (0 for other types)
};

// The GGUF arch of a Llama-family model: llama, or qwen2 (Qwen2ForCausalLM: q/k/v biases, NEOX rope).
enum class GgufArch { Llama, Qwen2 };
// Writes `path` whole (atomic_write_file) as `arch`. llama: the model's rows of wq and wk are llama2.c's interleaved
// RoPE layout, which is llama.cpp's for this arch; llama3 rope scaling as llama.cpp's rope_freqs table. qwen2: the
// same keys under qwen2.*, wq's and wk's rows and biases permuted back to Hugging Face's rotate-half layout (as
// convert_hf_to_gguf.py's Qwen2Model leaves them). castor::Error, nothing written, when the vocabulary's size is not
// the model's, or qwen2 gets a model without q/k/v biases, with other biases or llama3 rope scaling.
// `context_length`: the model's context (a Hugging Face model's max_position_embeddings, where a fine-tuning run's
// model reads its shorter block size); 0: the model's max_seq_len.
GgufSummary write_gguf_llama(const std::string& path, const Llama& model, const GgufVocabulary& vocab, GgufType type,
                             const std::string& name, GgufArch arch = GgufArch::Llama, int64_t context_length = 0);
// Writes `path` as arch `gpt2`: the embedding cut to the vocabulary's rows (a padded vocabulary's extra rows are never
// drawn), zero biases for a bias-free model (llama.cpp's gpt2 requires them).
GgufSummary write_gguf_gpt(const std::string& path, const GPTWeights& weights, const GgufVocabulary& vocab,
                           GgufType type, const std::string& name);

}  // namespace castor::models
