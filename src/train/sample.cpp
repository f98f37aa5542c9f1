// `castor sample` (text from a GPT with a KV cache) and `castor export --llmc` (a GPT in llm.c's checkpoint format).
#include "castor/sample.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "castor/checkpoint.h"
#include "castor/fs.h"
#include "castor/llmc.h"
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
  // Reads castor.config's n_head, and names the file if that metadata is not JSON; so it parses below.
  models::GPTWeights weights = models::gpt_weights_from_safetensors(std::move(ck.model), ck.model_meta, n_head, what);
  Json config;
  if (auto it = ck.model_meta.find("castor.config"); it != ck.model_meta.end()) config = Json::parse(it->second);
  return {std::move(weights), config, what};
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
      "tokens drawn at --temperature from the --top-k most likely.",
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
  app.add_option("--temperature", c.temperature, "divides the logits; 0: the most likely token");
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

std::string run_sample(const SampleConfig& c) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  LoadedGpt g = load_gpt(c.init.empty() ? c.checkpoint : c.init, c.n_head);
  std::string dir = c.tokenizer_dir.empty() ? recorded_data_dir(g.config) : c.tokenizer_dir;
  CASTOR_CHECK(!dir.empty(), "--tokenizer-dir: missing; ", g.what, " records no data directory to decode with");
  data::Tokenizer tok = data::Tokenizer::load(dir);
  models::GPTConfig& config = g.weights.config;
  CASTOR_CHECK(tok.vocab_size() <= config.vocab_size, dir, ": the tokenizer has ", tok.vocab_size(),
               " tokens, more than the model's vocabulary of ", config.vocab_size, " (", g.what, ")");
  CASTOR_CHECK(config.real_vocab_size == 0 || config.real_vocab_size == tok.vocab_size(), dir, ": the tokenizer has ",
               tok.vocab_size(), " tokens, ", g.what, " was made for ", config.real_vocab_size);
  config.real_vocab_size = tok.vocab_size();
  std::vector<int64_t> prompt;
  try {
    for (uint16_t t : tok.encode(c.prompt)) prompt.push_back(t);
  } catch (const Error& e) {
    throw Error(detail::cat("--prompt: ", e.what()));
  }
  if (prompt.empty()) {
    CASTOR_CHECK(tok.kind() == "gpt2", "--prompt: empty; a character model needs at least one character to start from");
    prompt.push_back(data::Gpt2Tokenizer::kEot);
  }
  auto model = models::gpt(config);
  model->load_state_dict(g.weights.state);
  model->eval();
  const std::vector<int64_t> seq = models::generate(*model, prompt, c.tokens, c.temperature, c.top_k, c.seed);
  // GPT-2's leading <|endoftext|> of an empty prompt is not text.
  const size_t skip = c.prompt.empty() ? 1 : 0;
  const std::vector<uint16_t> out(seq.begin() + skip, seq.end());
  return tok.decode(out);
}

ExportConfig parse_export_flags(const std::vector<std::string>& args) {
  ExportConfig c;
  parse_flags(*export_app(c), args, "export");
  CASTOR_CHECK(c.llmc, "--llmc: missing (the format to write; llm.c's is the only one so far)");
  return c;
}

std::string export_help() {
  ExportConfig c;
  return export_app(c)->help();
}

Json run_export(const ExportConfig& c) {
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
  return Json::Object{{"out", c.out},
                      {"format", "llmc"},
                      {"from", g.what},
                      {"n_layer", config.n_layer},
                      {"n_head", config.n_head},
                      {"n_embd", config.n_embd},
                      {"block_size", config.block_size},
                      {"vocab_size", config.real_vocab_size > 0 ? config.real_vocab_size : config.vocab_size},
                      {"padded_vocab_size", config.vocab_size},
                      {"bytes", bytes}};
}

}  // namespace castor::train
