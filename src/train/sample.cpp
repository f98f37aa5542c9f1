// `castor sample` (text from a GPT with a KV cache) and `castor export --llmc` (a GPT in llm.c's checkpoint format).
#include "castor/sample.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/llmc.h"
#include "castor/ops.h"
#include "castor/tokenizer.h"
#include "train/cli.h"

namespace castor::train {
namespace {

// A GPT's weights from a run or checkpoint directory or a weights file, with the run's settings (null when none).
struct LoadedGpt {
  models::GPTWeights weights;
  Json config;
  std::string what;
};

LoadedGpt load_gpt(const std::string& path, int64_t n_head) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {models::load_gpt_init(path, n_head), Json(), path};
  std::string used;
  Checkpoint ck = read_checkpoint(path, &used);
  const std::string what = (fs::path(used) / "model.safetensors").string();
  if (auto it = ck.model_meta.find("castor.model"); it != ck.model_meta.end())
    CASTOR_CHECK(it->second.rfind("gpt", 0) == 0, path, ": a ", printable(it->second),
                 " checkpoint, not a GPT's");
  Json config = castor_config(ck.model_meta, what);
  models::GPTWeights weights = models::gpt_weights_from_safetensors(std::move(ck.model), ck.model_meta, n_head, what);
  return {std::move(weights), std::move(config), what};
}

// The token directory a run trained on: its recorded data_dir, or setup's data/<name> for --data brown|brown-char.
std::string recorded_data_dir(const Json& config) {
  if (!config.is_object()) return "";
  if (const Json* d = config.find("data_dir"); d && d->is_string() && !d->as_string().empty()) return d->as_string();
  const Json* d = config.find("data");
  if (d && d->is_string() && (d->as_string() == "brown" || d->as_string() == "brown-char")) return "data/" + d->as_string();
  return "";
}

}  // namespace

std::unique_ptr<CLI::App> sample_app(SampleConfig& c) {
  auto owner = make_app(
      "Generates text from a GPT (KV cache: each new token costs one position's work): the prompt, then --tokens "
      "tokens drawn at --temperature from the --top-k most likely, each printed as it is drawn.",
      "castor sample");
  CLI::App& app = *owner;
  auto* ckpt = app.add_option("--checkpoint", c.checkpoint, "a run or checkpoint directory of a GPT");
  add_init(app, c.init, "or weights: llm.c .bin or safetensors with nanoGPT names")->excludes(ckpt);
  app.add_option("--tokenizer-dir", c.tokenizer_dir,
                 "token directory whose tokenizer.json decodes (default: the run's)");
  add_n_head(app, c.n_head, "attention heads, for safetensors that do not record them");
  app.add_option("--prompt", c.prompt, "the text to continue (default a newline; empty: GPT-2's <|endoftext|>)")
      ->default_str("\"\\n\"");
  app.add_option("--tokens", c.tokens, "tokens to generate");
  app.add_option("--temperature", c.temperature, "divides the logits; 0 (or below 1e-4): the most likely token");
  app.add_option("--top-k", c.top_k, "draw from the k most likely tokens only; 0: all");
  add_seed(app, c.seed, "the sampling generator's seed");
  add_threads(app, c.threads, "OpenMP threads (one suits small models best; 0: all cores)");
  return owner;
}

std::unique_ptr<CLI::App> export_app(ExportConfig& c) {
  auto owner = make_app(
      "Writes a GPT checkpoint in another tool's format: --llmc, llm.c's gpt2_124M.bin layout (float32).",
      "castor export");
  CLI::App& app = *owner;
  app.add_flag("--llmc", c.llmc, "llm.c's checkpoint format");
  app.add_option("--checkpoint", c.checkpoint, "a run or checkpoint directory, or an llm.c .bin or safetensors file")
      ->required();
  app.add_option("--out", c.out, "the file to write (replaced whole, or left as it was on failure)")->required();
  add_n_head(app, c.n_head, "attention heads, for safetensors that do not record them");
  return owner;
}

SampleConfig parse_sample_flags(const std::vector<std::string>& args) {
  SampleConfig c;
  parse_flags(*sample_app(c), args, "sample");
  CASTOR_CHECK(!c.checkpoint.empty() || !c.init.empty(), "--checkpoint: missing (a GPT run or checkpoint directory, "
               "or --init FILE with --tokenizer-dir DIR)");
  CASTOR_CHECK(c.tokens >= 0, "--tokens: must be non-negative, got ", c.tokens);
  CASTOR_CHECK(c.temperature >= 0 && std::isfinite(c.temperature), "--temperature: must be non-negative, got ",
               c.temperature);
  CASTOR_CHECK(c.top_k >= 0, "--top-k: must be non-negative, got ", c.top_k);
  return c;
}

std::string sample_help() {
  SampleConfig c;
  return sample_app(c)->help();
}

void run_sample(const SampleConfig& c, const std::function<void(std::string_view)>& write) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  LoadedGpt g = load_gpt(c.init.empty() ? c.checkpoint : c.init, c.n_head);
  for (const auto& [name, t] : g.weights.state)
    CASTOR_CHECK(!is_floating(t.dtype()) || isfinite_all(t), g.what, ": ", name,
                 " holds NaN or infinite values; no text can be sampled from it");
  std::string dir = c.tokenizer_dir.empty() ? recorded_data_dir(g.config) : c.tokenizer_dir;
  CASTOR_CHECK(!dir.empty(), "--tokenizer-dir: missing; ", g.what, " records no data directory to decode with");
  data::Tokenizer tok = data::Tokenizer::load(dir);
  models::GPTConfig& config = g.weights.config;
  CASTOR_CHECK(tok.vocab_size() <= config.vocab_size, dir, ": the tokenizer has ", tok.vocab_size(),
               " tokens, more than the model's vocabulary of ", config.vocab_size, " (", g.what, ")");
  CASTOR_CHECK(config.real_vocab_size == 0 || config.real_vocab_size == tok.vocab_size(), dir, ": the tokenizer has ",
               tok.vocab_size(), " tokens, ", g.what, " was made for ", config.real_vocab_size);
  config.real_vocab_size = tok.vocab_size();
  std::vector<uint16_t> prompt_ids;
  try {
    prompt_ids = tok.encode(c.prompt);
  } catch (const Error& e) {
    throw Error(detail::cat("--prompt: ", e.what()));
  }
  if (prompt_ids.empty()) {
    CASTOR_CHECK(tok.kind() == "gpt2", "--prompt: empty; a character model needs at least one character to start from");
    prompt_ids.push_back(data::Gpt2Tokenizer::kEot);  // not text: not written
  } else {
    write(tok.decode(prompt_ids));
  }
  auto model = models::gpt(config);
  model->load_state_dict(g.weights.state);
  model->eval();
  // Each token is written as it is drawn (both tokenizers decode a sequence as the concatenation of its tokens).
  models::generate(*model, std::vector<int64_t>(prompt_ids.begin(), prompt_ids.end()), c.tokens, c.temperature,
                   c.top_k, c.seed, [&](int64_t t) {
                     const uint16_t id = static_cast<uint16_t>(t);
                     write(tok.decode({&id, 1}));
                   });
}

ExportConfig parse_export_flags(const std::vector<std::string>& args) {
  ExportConfig c;
  parse_flags(*export_app(c), args, "export");
  CASTOR_CHECK(c.llmc, "--llmc: missing (the format to write; llm.c's is the only one so far)");
  CASTOR_CHECK(!c.out.empty(), "--out: empty (the file to write)");
  return c;
}

std::string export_help() {
  ExportConfig c;
  return export_app(c)->help();
}

Json run_export(const ExportConfig& c) {
  try {  // before the checkpoint is read: a device, FIFO, directory or link at --out is refused at once
    check_replaceable(c.out);
  } catch (const Error& e) {
    throw Error(detail::cat("--out: ", e.what()));
  }
  LoadedGpt g = load_gpt(c.checkpoint, c.n_head);
  models::GPTConfig& config = g.weights.config;
  // llm.c's V: the tokenizer's vocabulary when the run records its data directory, else the padded size.
  if (config.real_vocab_size == 0) {
    const std::string dir = recorded_data_dir(g.config);
    if (!dir.empty() && file_exists(dir + "/tokenizer.json")) {
      const int64_t v = data::Tokenizer::load(dir).vocab_size();
      CASTOR_CHECK(v <= config.vocab_size, dir, ": the tokenizer has ", v, " tokens, more than the model's ",
                   config.vocab_size);
      config.real_vocab_size = v;
    }
  }
  models::write_llmc_checkpoint(c.out, g.weights);
  uint64_t bytes = 0;
  read_file_range(c.out, 0, 0, bytes);
  return Json::Object{{"out", printable(c.out)},  // a report line: any path, non-UTF-8 bytes as \xNN
                      {"format", "llmc"},
                      {"from", printable(g.what)},
                      {"n_layer", config.n_layer},
                      {"n_head", config.n_head},
                      {"n_embd", config.n_embd},
                      {"block_size", config.block_size},
                      {"vocab_size", config.real_vocab_size > 0 ? config.real_vocab_size : config.vocab_size},
                      {"padded_vocab_size", config.vocab_size},
                      {"bytes", bytes}};
}

}  // namespace castor::train
