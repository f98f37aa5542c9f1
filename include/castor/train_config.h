// The resolved settings of a `castor train` run, parsed from command-line flags and validated.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "castor/backends.h"
#include "castor/corpus.h"
#include "castor/dtype.h"
#include "castor/json.h"
#include "castor/lm_batch.h"
#include "castor/opt_level.h"
#include "castor/quant.h"
#include "castor/tokenizer.h"

namespace castor::train {

// The choices of the enumerated flags; name() gives each one's spelling on the command line and in config.json.
enum class Dataset { FashionMnist, Cifar10, Synthetic, Folder, Brown, BrownChar, BrownBpe, Tokens };
enum class ModelKind { SimpleCnn, ResNet18, ResNet9, Gpt, GptMini, Gpt2, Llama, Llama260k, Llama15m };
enum class OptimizerKind { Sgd, Adam, AdamW, AdamW8bit };
enum class Schedule { None, Step, Cosine, OneCycle, WarmupCosine };
using DataOrder = data::LmOrder;  // language-model batches: nanoGPT's random windows or llm.c's two orders
enum class Augment { None, Standard };
enum class Compression { None, BFloat16, Float16 };  // the gradients' type on the wire between ranks
enum class Recompute { None, Blocks, Auto };         // activation recompute of a language model's blocks
const char* name(Dataset v);
const char* name(ModelKind v);
const char* name(OptimizerKind v);
const char* name(Schedule v);
const char* name(Augment v);
const char* name(Compression v);
const char* name(Recompute v);
const char* name(DataOrder v);
const char* name(backends::ConvAlgorithm v);
bool is_language_model(ModelKind m);  // a model of a family in src/train/family.h's table
bool is_text(Dataset d);

struct TrainConfig {
  Dataset data = Dataset::FashionMnist;
  std::string data_dir;          // default: the dataset's Debian location (--data folder: required)
  int64_t image_size = 32;       // --data folder: images are resized and centre-cropped to this square
  double val_split = 0.1;        // --data folder without DIR/val: this share of DIR/train is held out
  bool skip_bad_images = false;  // --data folder: leave unreadable images out (counted) instead of failing
  int64_t image_cache_mb = -1;   // --data folder: decoded images kept in memory up to this; -1: half the RAM
  ModelKind model = ModelKind::SimpleCnn;
  // --model gpt / gpt-mini / gpt2 and llama / llama-260k / llama-15m (nanoGPT's flags; a Llama's dim, n_layers,
  // n_heads and max_seq_len are n_embd, n_layer, n_head and block_size); 0: the preset's value (vocab_size: the
  // tokenizer's).
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  double dropout = 0.0;
  bool bias = true;             // GPT only
  int64_t n_kv_head = 0;        // Llama: key/value heads (0: the preset's); fewer than n_head: grouped-query attention
  int64_t multiple_of = 0;      // Llama: the feed-forward width rounds up to a multiple of this (0: the preset's)
  double rope_theta = 10000.0;  // Llama: the rotary embedding's base
  bool untied = false;          // Llama: the output layer has its own weight (llama2.c ties it to tok_embeddings)
  DataOrder data_order = DataOrder::Random;
  amp::OptLevel amp = amp::OptLevel::O1;
  DType dtype = DType::BFloat16;  // the 16-bit type of O1-O3
  // `castor train`'s default, --precision auto / --amp auto: amp and dtype chosen for this CPU when the flags are
  // parsed (O1 bfloat16 where it has bfloat16 dot-product units, else O0: amp::auto_precision) and recorded as chosen.
  bool precision_auto = false;
  std::string precision_reason;      // why auto chose them ("auto: avx512_bf16"); empty when they were given
  bool stochastic_rounding = false;  // O3: round optimizer updates stochastically
  std::optional<double> loss_scale;  // a static loss scale; nullopt: the level's default (dynamic at O1/O2)
  OptimizerKind optimizer = OptimizerKind::Adam;
  double lr = 1e-3;
  double momentum = 0.9;
  double weight_decay = 0.0;
  Schedule schedule = Schedule::None;
  int64_t warmup_steps = 0;     // warmup-cosine: linear warmup steps
  double min_lr = 0.0;          // warmup-cosine: the learning rate the cosine ends at
  double beta2 = 0.999;         // Adam/AdamW
  double clip_grad_norm = 0.0;  // > 0: clip the unscaled gradients to this total 2-norm
  int64_t grad_accum = 1;       // micro-batches per optimizer step
  double label_smoothing = 0.0;
  int64_t batch_size = 64;  // images per micro-batch and rank (the global batch is batch_size x nproc)
  int64_t epochs = 1;
  int64_t steps = 0;                // > 0: stop after this many optimizer steps (overrides epochs)
  Augment augment = Augment::None;  // standard: random crop (pad 4) and horizontal flip
  uint64_t seed = 0;
  int threads = 0;              // per rank; 0: the machine's cores divided among its ranks
  int nproc = 0;                // data-parallel ranks (0: not given; one, or mpirun's -np)
  bool sync_batchnorm = false;  // with several ranks: BatchNorm statistics over the global batch
  Compression compress_grads = Compression::None;
  int zero = 0;          // with several ranks, ZeRO: 1 shards the optimizer's masters and state, 2 also the gradients
  bool dry_run = false;  // --dry-run: print the per-rank memory plan (train/memory_plan.h) and stop
  bool deterministic = false;
  backends::ConvAlgorithm conv_algorithm = backends::ConvAlgorithm::Auto;  // float32 convolutions (castor/backends.h)
  Recompute recompute = Recompute::None;  // blocks: nn::checkpoint per transformer block; auto: by memory_budget
  double memory_budget = 0;               // GiB the run may take (--recompute auto); 0: not given

  std::string out;                       // empty: a new runs/<date>-<time>-<model>-<precision> for each run
  std::string resume;                    // a run directory (or one of its checkpoints) to continue from
  bool convert_optimizer_state = false;  // --resume may switch between adamw and adamw8bit, converting the state
  bool overwrite = false;                // a new run may replace another run's files in --out
  std::string init;                      // a safetensors file of initial weights (PyTorch names)
  // LoRA fine-tuning of the --init base (nn::apply_lora): rank 0 trains every weight, as without LoRA.
  int64_t lora_rank = 0;
  double lora_alpha = 8, lora_dropout = 0;
  std::string lora_targets = "all-linear";  // comma-separated module names (nn::LoraConfig::target_modules)
  bool rslora = false;
  std::string init_lora;  // a PEFT adapter directory (adapter_config.json, adapter_model.safetensors)
  // Not flags: --init-lora's per-module ranks and alphas (PEFT's rank_pattern, alpha_pattern: nn::LoraConfig's), in
  // the file's order; config.json records them as lora_rank_pattern and lora_alpha_pattern, [[key, value], ...].
  std::vector<std::pair<std::string, int64_t>> lora_rank_pattern;
  std::vector<std::pair<std::string, double>> lora_alpha_pattern;
  std::string lora_base;  // a resumed LoRA run's base where it is now (it moved); replaces init
  // QLoRA: the base's Linears but the output layer stored in these blocks while loading (F32: not quantized)
  quant::BlockType quantize_base = quant::BlockType::F32;
  bool double_quant = true;     // NF4's absmaxes double-quantized (QLoRA's recipe)
  std::string init_checksum;    // not a flag: the checksum a run recorded of --init (its LoRA base is checked)
  int64_t real_vocab_size = 0;  // not a flag: the vocabulary a model was made for (recorded, or an --init's)
  // Not flags: the vocabulary the model was trained in (a run's recorded "tokenizer", "real_vocab_size" and
  // "vocab_checksum", or an --init's: train::model_vocabulary), compared with the token folder's, and the run or file
  // it comes from (for messages; "" when unknown).
  data::VocabularyId vocab;
  std::string vocab_of;
  // Not a flag: the model's description (config.json's "model_config") when the flags do not give all of it: an
  // --init Hugging Face directory's (its norm eps, feed-forward width, ...), or a run's recording read back.
  Json model_config;
  int64_t checkpoint_every = 0;    // steps; 0: at each epoch end
  double checkpoint_minutes = 10;  // also checkpoint when this long has passed since the last one; 0: never
  int64_t keep = 2;                // checkpoints kept
  int64_t log_every = 50;          // steps between metric lines
  int64_t eval_every = 0;          // > 0: evaluate every N steps too (always at each epoch end)
  int64_t eval_iters = 0;          // language models: > 0: batches of batch_size rows per evaluation (nanoGPT)
  std::string eval_task;           // language models: a multiple-choice task (castor eval --task's) scored at each
                                   // evaluation, as task_acc, task_acc_norm and task_acc_norm_tokens
  std::string task_format;         // --eval-task's layout (empty: inferred from its rows)
  std::string keep_best;           // an evaluation's metric: RUN/best holds the checkpoint where it was best
  int64_t early_stop = 0;          // > 0: stop after this many evaluations without a better keep_best
  int64_t synthetic_size = 2048;   // training images of --data synthetic
  bool profile = false;
  std::vector<std::string> given_flags;  // the flags set on the command line or in --config, as "--lr"

  // Whether `flag` ("--lr") was set on the command line or in --config. `flag` must be a row of the settings table
  // (src/train/settings.cpp); any other name is a broken invariant (CASTOR_ASSERT), never a silent "no".
  bool given(std::string_view flag) const;
};

// The --precision spelling (Lightning 2's) of the config's opt level and dtype; O2 as "O2-bf16" / "O2-fp16".
std::string precision_name(const TrainConfig& c);

// `castor train --nproc N` outside mpirun: the mpirun command line that runs `exe` with `args` on N local ranks
// (--oversubscribe --bind-to none, and --allow-run-as-root for root). Empty when no re-launch is needed.
std::vector<std::string> mpirun_command(const TrainConfig& c, const std::string& exe,
                                        const std::vector<std::string>& args);

// Parses `castor train` flags (argv after the subcommand; `--config FILE` reads more from a TOML/INI file).
// Throws castor::Error naming the flag and the problem, in one line.
TrainConfig parse_train_flags(const std::vector<std::string>& args);
std::string train_help();

// The settings a run records in config.json and its checkpoints (keys are the flags' names with '_' for '-').
Json settings_json(const TrainConfig& c);

// The config of `castor train --resume DIR ...`: the settings `recorded` in DIR, with the flags given now that
// the settings table (src/train/settings.cpp) lets a resume change (those that do not change the computation: --steps/
// --epochs, --log-every, ...; --batch-size is checked against the recorded global batch by run_train). Any other given
// flag that differs from the recording is refused with one castor::Error naming each differing setting; `what` names
// the recording in errors.
TrainConfig resume_config(const TrainConfig& given, const Json& recorded, const std::string& what);

// `castor eval`: a castor checkpoint, or weights without castor metadata given model and data.
struct EvalConfig {
  std::string path;                // run directory, checkpoint directory or safetensors file
  std::optional<ModelKind> model;  // for files without castor metadata (e.g. written by PyTorch)
  std::optional<Dataset> data;
  std::string data_dir;
  int64_t batch_size = 0;      // images or token rows per batch; 0: the task's (256 images, rows of ~4096 tokens)
  std::optional<DType> dtype;  // float32: evaluate at O0; bf16/fp16: autocast to it; none: as the run trained
  // Language-model weights without castor metadata: the heads, which no tensor's shape holds (0: not given).
  int64_t n_head = 0;
  // A language model's evaluation window, at most its context (0: the run's block size; a Hugging Face model's context
  // up to formats::kDefaultWindow); a Llama without castor metadata: its context too.
  int64_t block_size = 0;
  std::string lora_base;  // a LoRA run's base where it is now (it moved since the run recorded it)
  std::string lora;       // a PEFT adapter directory merged into the model evaluated ("": none)
  // A language model's multiple-choice task (lm-evaluation-harness's scoring) or llama.cpp's perplexity on a text,
  // instead of its validation loss.
  std::string task;              // --task FILE.jsonl
  std::string task_format;       // --task-format (empty: inferred from the rows)
  int64_t num_fewshot = 0;       // --num-fewshot
  std::string fewshot_file;      // --fewshot-file
  std::string fewshot_sampler;   // --fewshot-sampler: default or first_n (empty: the task's)
  uint64_t fewshot_seed = 1234;  // --fewshot-seed: lm-eval's fewshot_random_seed
  int64_t limit = 0;             // --limit: the first N rows (0: all)
  bool add_bos = false;          // --add-bos: lm-eval's add_bos_token=True
  std::string log_samples;       // --log-samples FILE: a JSON line a row
  std::string text;              // --text FILE: perplexity
  int64_t ctx = 0;               // --ctx: perplexity's chunk (0: the model's block size)
  std::string tokenizer_dir;     // --tokenizer-dir: default the run's or the model directory's
};
EvalConfig parse_eval_flags(const std::vector<std::string>& args);
std::string eval_help();
std::string info_help();

// `castor tokenize` flags (--tokenizer, --input FILE..., --brown DIR, --bpe-dir, --out, --val-every | --val-fraction);
// --brown without a split flag means --val-every 10.
data::TokenizeOptions parse_tokenize_flags(const std::vector<std::string>& args);
std::string tokenize_help();
// A bash or zsh ("bash", "zsh") completion script for `castor`, generated from the same flag tables: subcommands, each
// one's flags, and the values of the enumerated flags (--precision, --model, --data, ...).
std::string shell_completion(const std::string& shell);

}  // namespace castor::train
