// A language model read from any file or directory castor reads (a run or checkpoint, safetensors, a Hugging Face
// directory, llm.c's and llama2.c's files) with the tokenizer of its vocabulary: what castor sample and castor eval's
// tasks and perplexity run on.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "castor/language_model.h"
#include "castor/tokenizer.h"

namespace castor::train {

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
