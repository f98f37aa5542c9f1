// The `castor sample` command: text from a GPT or Llama (a run's, or a model file's) with a KV cache.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "castor/dtype.h"
#include "castor/json.h"

namespace castor::train {

struct SampleConfig {
  std::string checkpoint;     // a run directory or checkpoint directory (its newest intact checkpoint)
  std::string init;           // or weights: an llm.c .bin or safetensors with nanoGPT names
  std::string tokenizer_dir;  // a token directory's tokenizer; default: the run's recorded data directory
  int64_t n_head = 0;         // for safetensors that do not record it
  std::string lora_base;      // a LoRA run's base where it is now (it moved since the run recorded it)
  std::string prompt = "\n";  // empty: GPT-2's <|endoftext|> (a char tokenizer needs a prompt)
  int64_t tokens = 200;       // new tokens
  double temperature = 0.8;   // 0 (or below models::kMinTemperature, 1e-4): greedy
  int64_t top_k = 200;        // 0: the whole vocabulary
  uint64_t seed = 1337;
  bool cached_window = false;  // --window cached: the KV cache rebuilt from half a block past it; else nanoGPT's
  int threads = 1;             // OpenMP threads: a token's ops are small, and more threads mostly wait on each other
  double top_p = 0.9;          // in (0, 1): run.c's nucleus sampling, with run.c's default; 1: off
  int64_t num_samples = 1;     // samples, seeds seed, seed + 1, ... (nanoGPT's num_samples)
  std::string prompt_file;     // the prompt read from this file instead
  std::string chat_template;   // --chat-template: a template file in place of the model's
  bool chat = false;           // the chat template around the prompt as a user turn; stop at the end of the turn
  std::string system;          // --chat: a system turn first
  bool prompt_given = false;   // --chat without --prompt: turns read from stdin, one a line
  bool ignore_eos = false;     // plain text: run past the model's end-of-generation ids (nanoGPT's sample.py)
  std::string lora;            // a PEFT adapter directory merged into the model ("": none)
};
SampleConfig parse_sample_flags(const std::vector<std::string>& args);
std::string sample_help();
// Writes the prompt, then each generated token as it is drawn, decoded, to `write` (memory stays bounded however
// many --tokens); samples after the first follow a line "---------------" (nanoGPT's sample.py). A sample stops at a
// drawn end-of-generation id, as llama.cpp's does (unless ignore_eos): the tokenizer's end-of-sequence and end-of-turn
// tokens, the model's eos_token_id (config.json's, one or a list) and a llama2.c vocabulary's <s> (run.c's). --chat
// writes the reply alone, stopped at those or the template's end-of-turn token, and without --prompt answers each line
// `read_turn` gives (the conversation so far in the context) until it returns false. castor::Error naming the file
// when the weights hold NaN or infinite values.
void run_sample(const SampleConfig& c, const std::function<void(std::string_view)>& write,
                const std::function<bool(std::string&)>& read_turn = nullptr);

}  // namespace castor::train
