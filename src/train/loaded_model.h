// The model a command reads from --checkpoint or --init (castor sample, castor eval's tasks and perplexity, castor
// export): a run's or checkpoint's (a LoRA run's merged into its base), or any file the format table reads
// (castor/model_source.h), and a language model with the tokenizer of its vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/llmc.h"
#include "castor/serialize.h"
#include "castor/state_dict.h"
#include "castor/tokenizer.h"

namespace castor::train {

// A GPT's weights from a run or checkpoint directory or a weights file, with the run's settings (null when none); or a
// Llama's model (a run's built from its recorded settings, a llama2.c file's from its header) with its weights loaded.
struct LoadedGpt {
  formats::GPTWeights weights;
  Json config;
  std::string what;
  StateDict train_state;  // a checkpoint's train_state.safetensors (empty for a weights file or a LoRA run's)
  std::string run_dir;    // the run directory holding the checkpoint (empty when none)
  // A Llama's, or (keep_blocks) a LoRA run's over a quantized base, of any family: weights then empty.
  std::shared_ptr<models::LanguageModel> llama;
  bool lora = false;  // a LoRA run's checkpoint: its adapters merged into the base, or beside its blocks
  Metadata meta;      // the model file's metadata (castor.config: a merged LoRA run's as a plain run's)
};

// A weights file or a run or checkpoint directory; a LoRA run's model file (in its checkpoint or alone) merged into its
// base (`lora_base`: where the base is now, when it moved). `keep_blocks` (castor sample and eval): a GGUF file's
// quantized Linear weights stay in their blocks (formats::load_weights_into), never dense; a LoRA run over a quantized
// base (a GGUF file, or --quantize-base) is then its base in blocks with the adapters on it, unmerged.
LoadedGpt load_gpt(const std::string& path, int64_t n_head, const std::string& lora_base = "",
                   bool keep_blocks = false);

// A key of the model's recorded description (null when the run has none or it lacks the key).
Json described(const LoadedGpt& g, const char* key);

// A language model read from any file or directory castor reads (a run or checkpoint, safetensors, a Hugging Face
// directory, a GGUF file, llm.c's and llama2.c's files) with the tokenizer of its vocabulary: what castor sample and
// castor eval's tasks and perplexity run on.
struct LoadedLm {
  std::shared_ptr<models::LanguageModel> model;  // in eval mode
  data::Tokenizer tokenizer;
  std::string what;           // the model file, for messages
  std::string tokenizer_dir;  // where the tokenizer was read from
  // The ids generation ends at, as llama.cpp's end-of-generation tokens: the tokenizer's end-of-sequence and
  // end-of-turn (a character vocabulary has none), the model's eos_token_id (config.json's: one id or a list) and a
  // llama2.c vocabulary's <s> (run.c's sequence delimiter).
  std::set<int64_t> end_ids;
};
// `path`'s model (a LoRA run's merged into its base, found at `lora_base` when given) and the tokenizer of
// `tokenizer_dir` (default: the run's recorded data directory, or the one beside the model file), which must hold the
// model's vocabulary; `lora` ("": none), a PEFT adapter directory merged into it (castor sample|eval --init BASE --lora
// DIR). castor::Error naming the file when the weights hold NaN or infinite values, or no tokenizer is found.
LoadedLm load_language_model(const std::string& path, int64_t n_head, const std::string& lora_base,
                             const std::string& tokenizer_dir, const std::string& lora = "");

}  // namespace castor::train
