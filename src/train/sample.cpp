// `castor sample`: text from a GPT or Llama (a run's, or any file the format table reads) with a KV cache.
#include "castor/sample.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>

#include "castor/autocast.h"
#include "castor/checkpoint.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/gguf.h"
#include "castor/llama2c.h"
#include "castor/llmc.h"
#include "castor/model_source.h"
#include "castor/ops.h"
#include "castor/chat_data.h"
#include "castor/tokenizer.h"
#include "castor/torch_save.h"
#include "train/metrics.h"
#include "train/cli.h"
#include "train/lora_run.h"
#include "train/family.h"
#include "train/loaded_model.h"
#include "train/task.h"

namespace castor::train {

std::unique_ptr<CLI::App> sample_app(SampleConfig& c) {
  auto owner = make_app(
      "Generates text from a GPT or Llama as nanoGPT's sample.py (KV cache: while the text fits the block, each new token costs "
      "one position's work): the prompt, then --tokens tokens drawn at --temperature from the --top-k most likely, "
      "each printed as it is drawn.",
      "castor sample");
  CLI::App& app = *owner;
  auto* ckpt = app.add_option("--checkpoint", c.checkpoint, "a run or checkpoint directory of a GPT or Llama");
  add_init(
      app, c.init,
      "or weights: a Hugging Face model directory (config.json, model.safetensors or shards, tokenizer.json), "
      "a GGUF file, llm.c .bin, llama2.c model.bin (v0 or v1), safetensors with nanoGPT names, or a file castor export "
      "--safetensors wrote")
      ->excludes(ckpt);
  app.add_option("--tokenizer-dir", c.tokenizer_dir,
                 "token directory whose tokenizer decodes, or a Hugging Face model directory with tokenizer.json "
                 "(default: the run's, or the Hugging Face directory's own)");
  add_lora(app, c.lora,
           "a PEFT adapter directory (adapter_config.json, adapter_model.safetensors: PEFT's save_pretrained, castor "
           "export --format peft) merged into the model (--init BASE --lora DIR), without a training run");
  add_n_head(app, c.n_head, "attention heads, for safetensors that do not record them");
  add_lora_base(app, c.lora_base, kLoraBaseHelp);
  app.add_option("--prompt", c.prompt,
                 "the text to continue (default a newline; empty: GPT-2's <|endoftext|>; a llama2.c "
                 "vocabulary puts <s> first, as run.c does)")
      ->default_str("\"\\n\"");
  app.add_option("--prompt-file", c.prompt_file, "the prompt read from this file (nanoGPT's start=\"FILE:...\")");
  app.add_option("--tokens", c.tokens, "tokens to generate (at most)");
  app.add_option("--temperature", c.temperature, "divides the logits; 0 (or below 1e-4): the most likely token");
  app.add_option("--top-k", c.top_k, "draw from the k most likely tokens only; 0: all");
  app.add_option("--top-p", c.top_p,
                 "nucleus sampling as llama2.c's run.c (and its default): the most likely tokens whose probabilities "
                 "add up past p; 1: off (temperature 0 is greedy whatever p)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--num-samples", c.num_samples, "samples to draw (seeds --seed, --seed + 1, ...)")
      ->check(integer_in(1));
  app.add_flag("--chat", c.chat,
               "apply the chat template (the token directory's, else ChatML) to --prompt as a user turn and write the "
               "reply, stopping at the end-of-turn token; without --prompt, each line of stdin is a turn");
  app.add_option("--system", c.system, "--chat: a system turn before the first user turn");
  add_chat_template(app, c.chat_template);
  app.add_flag("--ignore-eos", c.ignore_eos,
               "generate --tokens tokens past the model's end-of-generation tokens (its end-of-sequence and "
               "end-of-turn ids, config.json's eos_token_id), where a sample stops by default as llama.cpp's does "
               "(nanoGPT's sample.py runs on); not with --chat");
  add_seed(app, c.seed, "the sampling generator's seed");
  app.add_option_function<std::string>(
         "--window", [&c](const std::string& w) { c.cached_window = w == "cached"; },
         "past the block size: sliding (nanoGPT's generate: each token from the last block-size tokens, one full "
         "forward a token) or cached (the KV cache rebuilt from the last half block when full: a context of half a "
         "block to a block, faster); the same tokens while the text fits the block")
      ->check(CLI::IsMember({"sliding", "cached"}))
      ->default_str("sliding");
  add_threads(app, c.threads, "OpenMP threads (one suits small models best; 0: all cores)");
  return owner;
}

SampleConfig parse_sample_flags(const std::vector<std::string>& args) {
  SampleConfig c;
  parse_flags(*sample_app(c), args, "sample");
  CASTOR_CHECK(!c.checkpoint.empty() || !c.init.empty(),
               "--checkpoint: missing (a GPT or Llama run or checkpoint directory, "
               "or --init FILE with --tokenizer-dir DIR)");
  CASTOR_CHECK(c.tokens >= 0, "--tokens: must be non-negative, got ", c.tokens);
  CASTOR_CHECK(c.temperature >= 0 && std::isfinite(c.temperature), "--temperature: must be non-negative, got ",
               c.temperature);
  CASTOR_CHECK(c.top_k >= 0, "--top-k: must be non-negative, got ", c.top_k);
  c.prompt_given = false;
  for (const std::string& a : args)
    if (a == "--prompt" || a.starts_with("--prompt=") || a == "--prompt-file" || a.starts_with("--prompt-file="))
      c.prompt_given = true;
  CASTOR_CHECK(c.prompt_file.empty() || std::find(args.begin(), args.end(), "--prompt") == args.end(),
               "--prompt-file: not with --prompt");
  CASTOR_CHECK(c.chat || c.system.empty(), "--system: only with --chat");
  CASTOR_CHECK(c.chat || c.chat_template.empty(), "--chat-template: only with --chat");
  CASTOR_CHECK(!c.chat || !c.ignore_eos, "--ignore-eos: not with --chat (a reply ends at its end-of-turn token)");
  if (!c.prompt_file.empty()) {
    const std::vector<uint8_t> bytes = read_file(c.prompt_file);
    c.prompt.assign(bytes.begin(), bytes.end());
  }
  return c;
}

std::string sample_help() {
  SampleConfig c;
  return sample_app(c)->help();
}

namespace {

// --chat: each prompt (or each line read_turn gives) a user turn, the reply written as it is drawn up to the end of
// its turn; the conversation goes on in the interactive mode.
void sample_chat(const SampleConfig& c, LoadedLm& lm, models::Window window, const std::set<int64_t>& ends,
                 const std::function<void(std::string_view)>& write,
                 const std::function<bool(std::string&)>& read_turn) {
  models::LanguageModel& model = *lm.model;
  data::Tokenizer& tok = lm.tokenizer;
  const std::string& dir = lm.tokenizer_dir;
  // The template: the token directory's record's, else the tokenizer's own (a Hugging Face directory's, ChatML).
  const bool recorded = !data::token_record_path(dir).empty();
  const Json record = recorded ? data::read_tokenizer_record(dir) : Json::Object{};
  data::ChatTokenizer ct = data::chat_tokenizer(tok, true, c.chat_template);
  if (const Json* t = record.find("chat_template"); t && t->is_string() && c.chat_template.empty())
    ct.chat_template = t->as_string(), ct.template_what = data::token_record_path(dir) + "'s chat_template";
  const data::ChatTemplate tmpl(ct.chat_template, ct.template_what);
  Json::Array messages;
  if (!c.system.empty()) messages.push_back(Json::Object{{"role", "system"}, {"content", c.system}});
  // One reply: the conversation rendered with the generation prompt, then tokens up to the end of the turn.
  auto reply = [&](uint64_t seed) {
    const data::TokenizedText ids = data::tokenize_rendered({data::render_prompt(messages, tmpl, ct), {}}, ct);
    std::vector<uint32_t> out;
    data::Tokenizer::Stream stream(tok, ids.ids.back());
    models::generate(
        model, std::vector<int64_t>(ids.ids.begin(), ids.ids.end()), c.tokens, c.temperature, c.top_k, seed, window,
        [&](int64_t t) {
          if (t == ct.eos_id || t == ct.eot_id || ends.count(t)) return false;
          const auto id = static_cast<uint32_t>(t);
          write(stream.next(id));
          out.push_back(id);
          return true;
        },
        c.top_p);
    write(stream.finish());
    return tok.decode(out);
  };
  auto turn = [&](const std::string& text, uint64_t seed) {
    messages.push_back(Json::Object{{"role", "user"}, {"content", text}});
    const std::string answer = reply(seed);
    messages.push_back(Json::Object{{"role", "assistant"}, {"content", answer}});
  };
  if (c.prompt_given || !read_turn) {
    for (int64_t i = 0; i < c.num_samples; ++i) {
      if (i > 0) write("\n---------------\n");
      turn(c.prompt, c.seed + static_cast<uint64_t>(i));
      messages.resize(messages.size() - 2);
    }
    return;
  }
  std::string line;
  for (uint64_t i = 0; read_turn(line); ++i) {
    turn(line, c.seed + i);
    write("\n");
  }
}

// A plain sample: the prompt, then tokens up to --tokens or an end-of-generation id.
void sample_text(const SampleConfig& c, LoadedLm& lm, models::Window window, const std::set<int64_t>& ends,
                 const std::function<void(std::string_view)>& write) {
  models::LanguageModel& model = *lm.model;
  data::Tokenizer& tok = lm.tokenizer;
  std::vector<uint32_t> prompt_ids;
  try {
    prompt_ids = tok.encode(c.prompt);
  } catch (const Error& e) {
    throw Error(detail::cat(c.prompt_file.empty() ? "--prompt: " : "--prompt-file " + c.prompt_file + ": ", e.what()));
  }
  const bool eot_start = prompt_ids.empty();
  if (eot_start) {
    CASTOR_CHECK(tok.kind() == "gpt2", "--prompt: empty; a character model needs at least one character to start from");
    prompt_ids.push_back(data::Gpt2Tokenizer::kEot);  // not text: not written
  }
  for (int64_t i = 0; i < c.num_samples; ++i) {
    if (i > 0) write("\n---------------\n");
    if (!eot_start) write(tok.decode(prompt_ids));
    // Each token is written as it is drawn, decoded after the one before it (bpe: run.c's decode(prev, token);
    // hf: an incomplete UTF-8 sequence or byte run held back until the tokens after it decide it).
    data::Tokenizer::Stream stream(tok, prompt_ids.back());
    models::generate(
        model, std::vector<int64_t>(prompt_ids.begin(), prompt_ids.end()), c.tokens, c.temperature, c.top_k,
        c.seed + static_cast<uint64_t>(i), window,
        [&](int64_t t) {
          if (ends.count(t)) return false;
          write(stream.next(static_cast<uint32_t>(t)));
          return true;
        },
        c.top_p);
    write(stream.finish());
  }
}

}  // namespace

void run_sample(const SampleConfig& c, const std::function<void(std::string_view)>& write,
                const std::function<bool(std::string&)>& read_turn) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  LoadedLm lm = load_language_model(c.init.empty() ? c.checkpoint : c.init, c.n_head, c.lora_base, c.tokenizer_dir,
                                    c.lora);
  // A model held in 16 bits (a 16-bit Hugging Face directory's) runs as a LoRA run's base does: under autocast, its
  // norms in float32, the KV cache in its dtype.
  const DType weights = lm.model->cache_shape().dtype;
  const amp::AutocastGuard autocast(is_16bit_float(weights) ? weights : DType::BFloat16, is_16bit_float(weights));
  const models::Window window = c.cached_window ? models::Window::Cached : models::Window::Sliding;
  // (--chat also at the template's end of turn)
  const std::set<int64_t> ends = c.ignore_eos ? std::set<int64_t>{} : lm.end_ids;
  if (c.chat)
    sample_chat(c, lm, window, ends, write, read_turn);
  else
    sample_text(c, lm, window, ends, write);
}

}  // namespace castor::train
