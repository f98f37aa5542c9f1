// The table of `castor train` settings and what is derived from it: the flags, config.json, resume and job checks.
#include "train/settings.h"

#include <algorithm>

#include "castor/fs.h"
#include "castor/mc_task.h"
#include "train/family.h"
#include "train/lora_run.h"
#include "train/task.h"

namespace castor::train {

namespace {

constexpr Spelling<backends::ConvAlgorithm> kConvAlgorithms[] = {{backends::ConvAlgorithm::Auto, "auto"},
                                                                 {backends::ConvAlgorithm::Direct, "direct"}};
constexpr Spelling<DataOrder> kDataOrders[] = {
    {DataOrder::Random, "random"}, {DataOrder::Sequential, "sequential"}, {DataOrder::Llmc, "llmc"}};
const Spelling<amp::OptLevel> kOptLevels[] = {{amp::OptLevel::O0, amp::opt_level_name(amp::OptLevel::O0)},
                                              {amp::OptLevel::O1, amp::opt_level_name(amp::OptLevel::O1)},
                                              {amp::OptLevel::O2, amp::opt_level_name(amp::OptLevel::O2)},
                                              {amp::OptLevel::O3, amp::opt_level_name(amp::OptLevel::O3)}};
// (config.json records dtype_name's spelling, the first of each)
constexpr Spelling<DType> kDTypes[] = {
    {DType::BFloat16, "bfloat16"}, {DType::Float16, "float16"}, {DType::BFloat16, "bf16"}, {DType::Float16, "fp16"}};
constexpr Spelling<OptimizerKind> kOptimizers[] = {{OptimizerKind::Sgd, "sgd"},
                                                   {OptimizerKind::Adam, "adam"},
                                                   {OptimizerKind::AdamW, "adamw"},
                                                   {OptimizerKind::AdamW8bit, "adamw8bit"}};
constexpr Spelling<Schedule> kSchedules[] = {{Schedule::None, "none"},
                                             {Schedule::Step, "step"},
                                             {Schedule::Cosine, "cosine"},
                                             {Schedule::OneCycle, "onecycle"},
                                             {Schedule::WarmupCosine, "warmup-cosine"}};
constexpr Spelling<Augment> kAugments[] = {{Augment::None, "none"}, {Augment::Standard, "standard"}};
constexpr Spelling<Recompute> kRecomputes[] = {
    {Recompute::None, "none"}, {Recompute::Blocks, "blocks"}, {Recompute::Auto, "auto"}};
// --quantize-base: "none" keeps the base dense.
constexpr Spelling<quant::BlockType> kQuantizeBases[] = {{quant::BlockType::F32, "none"},
                                                         {quant::BlockType::NF4, "nf4"},
                                                         {quant::BlockType::Q8_0, "q8_0"},
                                                         {quant::BlockType::Q4_0, "q4_0"},
                                                         {quant::BlockType::Q4_K, "q4_k"}};
constexpr Spelling<Compression> kCompressions[] = {
    {Compression::None, "none"}, {Compression::BFloat16, "bf16"}, {Compression::Float16, "fp16"}};

// A member's own flag: an option, or for a bool a switch (with --no-FLAG where it defaults to on).
template <auto M>
Field plain() {
  return {[](CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help) -> CLI::Option* {
            if constexpr (std::is_same_v<std::remove_reference_t<decltype(c.*M)>, bool>)
              return app.add_flag(TrainConfig{}.*M ? flag + ",!--no-" + flag.substr(2) : flag, c.*M, help);
            else
              return app.add_option(flag, c.*M, help);
          },
          [](const TrainConfig& c) { return Json(c.*M); },
          [](TrainConfig& to, const TrainConfig& from) { to.*M = from.*M; }, nullptr};
}

// A member of a flag other subcommands share (src/train/cli.h defines it with its check).
template <auto M, auto Add>
Field shared() {
  return {
      [](CLI::App& app, TrainConfig& c, const std::string&, const std::string& help) { return Add(app, c.*M, help); },
      [](const TrainConfig& c) { return Json(c.*M); },
      [](TrainConfig& to, const TrainConfig& from) { to.*M = from.*M; }, nullptr};
}

// An enumerated member, spelled as `Table` spells it.
template <auto M, const auto& Table>
Field choice() {
  return {[](CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help) {
            return add_choice(app, flag, c.*M, Table, help);
          },
          [](const TrainConfig& c) { return Json(spelling(Table, c.*M)); },
          [](TrainConfig& to, const TrainConfig& from) { to.*M = from.*M; }, [] { return spellings(Table); }};
}

// --amp: an opt level, or auto (the command's default; parse_settings chooses the level and dtype for this CPU, so
// config.json records the level chosen).
std::vector<std::string> amp_choices() {
  std::vector<std::string> names = spellings(kOptLevels);
  names.insert(names.begin(), "auto");
  return names;
}
Field amp_level() {
  return {
      [](CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help) {
        auto set = [&c](const std::string& v) {
          c.precision_auto = v == "auto";
          for (const Spelling<amp::OptLevel>& s : kOptLevels)
            if (v == s.name) c.amp = s.value;
        };
        return app.add_option_function<std::string>(flag, set, help)->check(one_of(amp_choices()))->default_str("auto");
      },
      [](const TrainConfig& c) { return Json(spelling(kOptLevels, c.amp)); },
      [](TrainConfig& to, const TrainConfig& from) { to.amp = from.amp; }, amp_choices};
}

// --loss-scale: "dynamic" (nullopt) or a positive number.
Field loss_scale() {
  return {[](CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help) {
            auto set = [&c](const std::string& v) {
              c.loss_scale = v == "dynamic" ? std::nullopt : std::optional<double>(std::stod(v));
            };
            return app.add_option_function<std::string>(flag, set, help)
                ->check(one_of({"dynamic"}) | positive())
                ->default_str("dynamic");
          },
          [](const TrainConfig& c) { return c.loss_scale ? Json(*c.loss_scale) : Json("dynamic"); },
          [](TrainConfig& to, const TrainConfig& from) { to.loss_scale = from.loss_scale; }, nullptr};
}

// --task-format's values.
const CLI::Validator& task_formats() {
  static const CLI::Validator v = [] {
    std::vector<std::string> names = data::mc_format_names();
    for (const char* chat : {"chat", "prompt-completion", "alpaca"}) names.push_back(chat);
    return one_of(names);
  }();
  return v;
}

// --eval-every, also spelled --eval-interval (nanoGPT's name).
Field eval_every() {
  Field f = plain<&TrainConfig::eval_every>();
  f.add = [](CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help) -> CLI::Option* {
    return app.add_option(flag + ",--eval-interval", c.eval_every, help + " (also --eval-interval, nanoGPT's name)");
  };
  return f;
}

// The --model spellings of `family`, or of every language model (null), as "gpt, gpt-mini or gpt2".
std::string presets_of(const Family* family) {
  std::vector<ModelKind> kinds;
  for (const Family& f : families())
    if (!family || family == &f) kinds.insert(kinds.end(), f.presets.begin(), f.presets.end());
  std::string text;
  for (size_t i = 0; i < kinds.size(); ++i)
    text += detail::cat(i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ", name(kinds[i]));
  return text;
}

using R = Resume;
using J = Job;

std::vector<Setting> make_settings() {
  static const CLI::Validator image_size = integer_in(1, 4096), at_least_minus_one = integer_in(-1),
                              layers = integer_in(0, 1024), width = integer_in(0, 65536), count = integer_in(0),
                              at_least_one = integer_in(1), ranks = integer_in(1, 1024), zero_stage = integer_in(0, 3),
                              // token ids are 32-bit (Llama 3: 128256, Qwen2: 151936)
      vocab = integer_in(0, (int64_t{1} << 31) - 1),
                              // train plus test images stay far inside int64 byte arithmetic
      synthetic = integer_in(1, int64_t{1} << 40);
  const CLI::Validator *unit = &unit_interval(), *pos = &positive(), *nonneg = &non_negative();
  using C = TrainConfig;
  return {
      {"--data", choice<&C::data, kDatasets>(),
       "dataset (folder: your images in DIR/train/<class>/*.png|jpg; brown, brown-char, brown-bpe: the Brown corpus as "
       "GPT-2 tokens, characters or a learned 512-piece llama2.c vocabulary, prepared by scripts/setup.sh; tokens: "
       "DIR/train.bin and DIR/val.bin)",
       nullptr, R::Fixed, J::Any},
      {"--data-dir", plain<&C::data_dir>(),
       "dataset directory (default /usr/share/datasets/fashion-mnist, ./cifar-10-batches-bin, or setup's data/brown, "
       "data/brown-char and data/brown-bpe, found from any directory: $CASTOR_SETUP_DIR, else where this build was configured)",
       nullptr, R::Fixed, J::Any},
      {"--data-order", choice<&C::data_order, kDataOrders>(),
       "language models: random windows (nanoGPT's get_batch), sequential (llm.c's validation loader: the file in "
       "order) or llmc (llm.c's training loader: those batches shuffled each epoch as train_gpt2.c does, seeded "
       "42 + rank)",
       nullptr, R::Fixed, J::LanguageModel},
      {"--image-size", plain<&C::image_size>(),
       "--data folder: images are resized (shorter side) and centre-cropped to this square", &image_size, R::Fixed,
       J::Folder},
      {"--val-split", plain<&C::val_split>(),
       "--data folder without DIR/val: the share of DIR/train held out for testing (by --seed)", unit, R::Fixed,
       J::Folder},
      {"--image-cache-mb", plain<&C::image_cache_mb>(),
       "--data folder: decoded images are kept in memory up to this many MiB (-1: half the machine's memory); a "
       "larger set is decoded again for each batch by the loader",
       &at_least_minus_one, R::Free, J::Folder},
      {"--skip-bad-images", plain<&C::skip_bad_images>(),
       "--data folder: leave unreadable images out (and count them) instead of stopping at the first", nullptr,
       R::Fixed, J::Folder},
      {"--model", choice<&C::model, kModels>(),
       "model (gpt: nanoGPT's GPT, 4 layers x 128 by default; gpt-mini: 6 x 384, block 256; gpt2: 124M; llama: "
       "llama2.c's Llama, 4 layers x 128, 8 heads over 4 kv heads, context 128; llama-260k: 5 x 64, 8 heads over 4, "
       "context 512; llama-15m: 6 x 288, 6 heads, context 256)",
       nullptr, R::Fixed, J::Any},
      {"--n-layer", plain<&C::n_layer>(), "language models: transformer blocks (0: the preset's)", &layers, R::Fixed,
       J::LanguageModel},
      {"--n-head", shared<&C::n_head, add_n_head>(), "language models: attention heads (0: the preset's)", nullptr,
       R::Fixed, J::LanguageModel},
      {"--n-embd", plain<&C::n_embd>(), "language models: embedding width (a Llama's dim; 0: the preset's)", &width,
       R::Fixed, J::LanguageModel},
      {"--block-size", plain<&C::block_size>(),
       "language models: context length (a Llama's max_seq_len; 0: the "
       "preset's)",
       &width, R::Fixed, J::LanguageModel},
      {"--vocab-size", plain<&C::vocab_size>(),
       "language models: vocabulary size (0: the tokenizer's; a GPT's padded to 64 above 1024, a Llama's exactly)",
       &vocab, R::Fixed, J::LanguageModel},
      {"--dropout", plain<&C::dropout>(), "language models: dropout probability", unit, R::Fixed, J::LanguageModel},
      {"--bias", plain<&C::bias>(), "GPT: biases in Linear and LayerNorm layers (--no-bias: none)", nullptr, R::Fixed,
       J::Gpt},
      {"--n-kv-head", plain<&C::n_kv_head>(),
       "Llama: key/value heads, dividing --n-head (fewer: grouped-query attention; 0: the preset's)", &layers, R::Fixed,
       J::Llama},
      {"--multiple-of", plain<&C::multiple_of>(),
       "Llama: the feed-forward width, 2/3 of 4 x --n-embd, rounds up to a multiple of this (0: the preset's)", &width,
       R::Fixed, J::Llama},
      {"--rope-theta", plain<&C::rope_theta>(), "Llama: the rotary embedding's base", pos, R::Fixed, J::Llama},
      {"--untied", plain<&C::untied>(),
       "Llama: the output layer gets its own weight (default: tied to the embedding, "
       "as llama2.c)",
       nullptr, R::Fixed, J::Llama},
      {"--amp", amp_level(),
       "opt level: O0 float32, O1 autocast + dynamic loss scaling, O2 16-bit model with float32 master weights "
       "(BatchNorm float32), O3 pure 16-bit; auto: O1 bfloat16 where the CPU has bfloat16 dot-product units "
       "(AVX512_BF16, AMX), else O0 (castor env says which)",
       nullptr, R::Fixed, J::Any},
      {"--dtype", choice<&C::dtype, kDTypes>(), "the 16-bit type of O1-O3", nullptr, R::Fixed, J::Any},
      {"--stochastic-rounding", plain<&C::stochastic_rounding>(),
       "O3 only: round optimizer updates stochastically (pure-bf16 training)", nullptr, R::Fixed, J::Any},
      {"--loss-scale", loss_scale(), "dynamic, or a static loss scale (a positive number)", nullptr, R::Fixed, J::Any},
      {"--optimizer", choice<&C::optimizer, kOptimizers>(),
       "optimizer (adamw8bit: AdamW with both moments in 8 bits, block-wise quantised as bitsandbytes' AdamW8bit; "
       "parameters under 4096 elements, norms and biases keep 32-bit moments)",
       nullptr, R::Fixed, J::Any},
      {"--lr", plain<&C::lr>(), "learning rate", pos, R::Fixed, J::Any},
      {"--momentum", plain<&C::momentum>(), "SGD momentum", unit, R::Fixed, J::Any},
      {"--weight-decay", plain<&C::weight_decay>(), "weight decay", nonneg, R::Fixed, J::Any},
      {"--schedule", choice<&C::schedule, kSchedules>(),
       "learning-rate schedule (warmup-cosine: nanoGPT's linear warmup then cosine down to --min-lr)", nullptr,
       R::Fixed, J::Any},
      {"--warmup-steps", plain<&C::warmup_steps>(), "warmup-cosine: linear warmup steps", &count, R::Fixed, J::Any},
      {"--min-lr", plain<&C::min_lr>(), "warmup-cosine: the final learning rate", nonneg, R::Fixed, J::Any},
      {"--beta2", plain<&C::beta2>(), "Adam/AdamW beta2", unit, R::Fixed, J::Any},
      {"--clip-grad-norm", plain<&C::clip_grad_norm>(), "clip the unscaled gradients to this total 2-norm (0: off)",
       nonneg, R::Fixed, J::Any},
      {"--grad-accum", plain<&C::grad_accum>(), "micro-batches whose gradients are summed per optimizer step",
       &at_least_one, R::Fixed, J::Any},
      {"--label-smoothing", plain<&C::label_smoothing>(), "cross-entropy label smoothing", unit, R::Fixed, J::Any},
      // (on resume: checked against the recorded global batch, which run_train splits among the ranks)
      {"--batch-size", plain<&C::batch_size>(),
       "images, or rows of --block-size tokens, per micro-batch and rank (global batch: x --nproc)", &at_least_one,
       R::Free, J::Any},
      {"--epochs", plain<&C::epochs>(), "epochs", &at_least_one, R::Length, J::Any},
      {"--steps", plain<&C::steps>(), "stop after this many optimizer steps (0: run the epochs)", &count, R::Length,
       J::Any},
      {"--augment", choice<&C::augment, kAugments>(), "random crop (pad 4) and horizontal flip", nullptr, R::Fixed,
       J::Image},
      {"--seed", shared<&C::seed, add_seed>(), "seed of the weights, the data order and augmentation", nullptr,
       R::Fixed, J::Any},
      {"--threads", shared<&C::threads, add_threads>(), "threads per rank (0: the cores divided among the ranks)",
       nullptr, R::FreeUnlessDeterministic, J::Any},
      {"--nproc", plain<&C::nproc>(),
       "data-parallel ranks on this machine: runs itself under mpirun -np N (under mpirun, its -np)", &ranks,
       R::Rechecked, J::Any},
      {"--sync-batchnorm", plain<&C::sync_batchnorm>(),
       "with several ranks: BatchNorm statistics of the global batch (default: each rank's own, as in DDP)", nullptr,
       R::Fixed, J::Any},
      {"--compress-grads", choice<&C::compress_grads, kCompressions>(),
       "with several ranks: send gradients as bf16 or fp16 (each addition in float32)", nullptr, R::Fixed, J::Any},
      {"--zero", plain<&C::zero>(),
       "with several ranks, ZeRO: 1 keeps each rank's slice of the float32 master weights and optimizer state, 2 "
       "also reduce-scatters the gradients into slices, 3 also keeps each rank's slice of a language model's block "
       "weights, gathered per block as it runs (0: every rank holds everything, as DDP)",
       &zero_stage, R::Free, J::Any, /*absent=*/"0"},
      {"--dry-run", plain<&C::dry_run>(),
       "print each rank's memory plan for --nproc and --zero 0-3 (weights, masters, optimizer state, gradients, from "
       "the sharding plan; activations left out) and stop without reading data or training",
       nullptr, R::Unrecorded, J::Any},
      {"--deterministic", plain<&C::deterministic>(), "fixed threading, for bit-exact resume", nullptr, R::Fixed,
       J::Any},
      {"--conv-algorithm", choice<&C::conv_algorithm, kConvAlgorithms>(),
       "float32 3x3 stride-1 convolutions: auto runs them as Winograd where oneDNN has it (AVX-512; 2x faster, errors "
       "a few times direct float32's, as cuDNN's defaults); direct: PyTorch's CPU numerics",
       nullptr, R::Fixed, J::Any, /*absent=*/"direct"},
      {"--recompute", choice<&C::recompute, kRecomputes>(),
       "activation recompute: blocks keeps only each transformer block's input and reruns the block in backward "
       "(about a third more compute, the same gradients bit for bit), and at O1 no 16-bit weight copies are kept "
       "between steps; auto: blocks only if the run's estimated peak "
       "without it passes --memory-budget",
       nullptr, R::Free, J::LanguageModel, /*absent=*/"none"},
      {"--memory-budget", plain<&C::memory_budget>(),
       "GiB (2^30 bytes) the run may take, for --recompute auto: a budget no choice fits is refused, naming the "
       "smallest that would",
       nonneg, R::Free, J::LanguageModel, /*absent=*/"0"},
      {"--out", plain<&C::out>(), "run directory (default: a new runs/<date>-<time>-<model>-<precision>)", nullptr,
       R::Unrecorded, J::Any},
      {"--resume", plain<&C::resume>(),
       "continue the run in this directory (or from one of its checkpoints) with its recorded settings; "
       "Ctrl-C/SIGTERM checkpoint and stop. Only these may change: ",
       nullptr, R::Unrecorded, J::Any},
      {"--convert-optimizer-state", plain<&C::convert_optimizer_state>(),
       "with --resume: switch the run between --optimizer adamw and adamw8bit, its moments converted (quantised to "
       "8 bits, or back to float32)",
       nullptr, R::Unrecorded, J::Any},
      {"--init", shared<&C::init, add_init>(),
       "initial weights (the run takes the model's sizes): a Hugging Face model directory (config.json and "
       "model.safetensors or shards: Llama, Mistral, Qwen2), a run or checkpoint directory, a safetensors file with "
       "PyTorch's names (a GPT: nanoGPT's), a llama2.c model.bin, or for a GPT an llm.c .bin checkpoint",
       nullptr, R::Fixed, J::Any},
      {"--lora-rank", plain<&C::lora_rank>(),
       "LoRA fine-tuning of the --init base: adapters of this rank on the --lora-targets layers, the base frozen "
       "(stored once in 16 bits at O1-O3); checkpoints hold the adapters and the base's path and checksum (0: off, "
       "every weight trains)",
       &count, R::Fixed, J::LanguageModel},
      {"--lora-alpha", plain<&C::lora_alpha>(), "LoRA: the adapters' output is scaled by alpha / rank", pos, R::Fixed,
       J::LanguageModel},
      {"--lora-dropout", plain<&C::lora_dropout>(), "LoRA: dropout on the adapters' input", unit, R::Fixed,
       J::LanguageModel},
      {"--lora-targets", plain<&C::lora_targets>(),
       "LoRA: the Linear layers adapted, by name (comma-separated: c_attn,c_proj; a layer matches a name its path "
       "ends in), or all-linear (every Linear but lm_head)",
       nullptr, R::Fixed, J::LanguageModel},
      {"--rslora", plain<&C::rslora>(), "LoRA: scale by alpha / sqrt(rank) (rank-stabilized LoRA)", nullptr, R::Fixed,
       J::LanguageModel},
      {"--init-lora", plain<&C::init_lora>(),
       "LoRA: start the adapters from a PEFT directory (adapter_config.json, adapter_model.safetensors, as castor "
       "export --peft writes); its config gives the rank, alpha, dropout, targets, rslora and "
       "per-module ranks and alphas (rank_pattern, alpha_pattern, as PEFT matches them)",
       nullptr, R::Fixed, J::LanguageModel},
      {"--lora-base", shared<&C::lora_base, add_lora_base>(), kLoraBaseHelp, nullptr, R::Unrecorded, J::LanguageModel},
      {"--quantize-base", choice<&C::quantize_base, kQuantizeBases>(),
       "LoRA (QLoRA): keep the base's Linear layers but the output layer in these blocks, quantized tensor by tensor "
       "while loading (nf4: bitsandbytes' NF4; q8_0, q4_0, q4_k: ggml's); each product dequantizes tiles of them in "
       "the compute dtype; embeddings and the output layer stay dense",
       nullptr, R::Fixed, J::LanguageModel, /*absent=*/"none"},
      {"--double-quant", plain<&C::double_quant>(),
       "LoRA with --quantize-base nf4: double-quantize the blocks' absmaxes (8-bit, blocks of 256; QLoRA's recipe)",
       nullptr, R::Fixed, J::LanguageModel},
      {"--checkpoint-every", plain<&C::checkpoint_every>(), "steps between checkpoints (0: at each epoch end)", &count,
       R::Free, J::Any},
      {"--checkpoint-minutes", plain<&C::checkpoint_minutes>(),
       "also checkpoint when this many minutes passed since the last one (0: never)", nonneg, R::Free, J::Any},
      {"--overwrite", plain<&C::overwrite>(), "let a new run replace another run's checkpoints and metrics in --out",
       nullptr, R::Unrecorded, J::Any},
      {"--keep", plain<&C::keep>(), "checkpoints kept", &at_least_one, R::Free, J::Any},
      {"--log-every", plain<&C::log_every>(), "steps between metric lines", &at_least_one, R::Free, J::Any},
      {"--eval-every", eval_every(),
       "evaluate every N steps as well as at each epoch end (0: off): test loss and accuracy, or a language model's "
       "validation loss and perplexity",
       &count, R::Free, J::Any},
      {"--eval-iters", plain<&C::eval_iters>(),
       "language models: an evaluation during training covers this many batches of --batch-size rows, spread evenly "
       "over the validation split (nanoGPT's eval_iters; default 200), or the whole split when it holds fewer "
       "(0: always the whole split; castor eval covers the whole split)",
       &count, R::Free, J::LanguageModel, "0"},
      {"--eval-task", plain<&C::eval_task>(),
       "a multiple-choice task (castor eval --task's JSONL: HellaSwag, MMLU, ARC, PIQA, Winogrande or {context, "
       "choices, label} rows) scored at each evaluation as lm-evaluation-harness does, in the run's tokenizer: "
       "task_acc, task_acc_norm and task_acc_norm_tokens in metrics.jsonl and the report; or held-out chat data "
       "(castor tokenize --format chat, prompt-completion or alpaca rows) tokenized as the run's token folder was: "
       "task_loss and task_perplexity over the answers' tokens",
       nullptr, R::Free, J::LanguageModel},
      {"--task-format", plain<&C::task_format>(),
       "--eval-task's layout: castor eval --task's, or chat, prompt-completion or alpaca (default: inferred from its "
       "rows' fields)",
       &task_formats(), R::Free, J::LanguageModel},
      {"--keep-best", plain<&C::keep_best>(),
       "an evaluation's metric (val_loss, val_perplexity, test_loss, test_accuracy, task_acc, task_acc_norm, "
       "task_acc_norm_tokens, task_loss, task_perplexity): RUN/best holds the checkpoint of its best value (the lowest loss or perplexity, the "
       "highest accuracy), whatever --keep prunes",
       nullptr, R::Free, J::Any},
      {"--early-stop", plain<&C::early_stop>(),
       "stop after N evaluations in a row without a better --keep-best metric (0: never)", &count, R::Free, J::Any},
      {"--synthetic-size", plain<&C::synthetic_size>(), "training images of --data synthetic", &synthetic, R::Fixed,
       J::Synthetic},
      {"--profile", plain<&C::profile>(), "print the top ops by time, with their dtypes", nullptr, R::Unrecorded,
       J::Any},
  };
}

bool may_change(const Setting& s, const TrainConfig& recorded) {
  return s.resume != Resume::Fixed && (s.resume != Resume::FreeUnlessDeterministic || !recorded.deterministic);
}

// The flags a resumed run may change, for --resume's help.
std::string resume_rule() {
  std::string list;
  for (const Setting& s : settings())
    if (s.resume != Resume::Fixed && s.flag != std::string_view("--resume"))
      list += detail::cat(list.empty() ? "" : ", ", s.flag,
                          s.resume == Resume::Length                    ? " (to extend)"
                          : s.resume == Resume::FreeUnlessDeterministic ? " (without --deterministic)"
                                                                        : "");
  return list;
}

// A run's recorded settings (run_dir.h's recorded_config) as flags, parsed (and so validated) like a command line.
TrainConfig parse_recorded_settings(const Json& recorded, const std::string& what) {
  std::vector<std::string> args;
  const Json defaults = settings_json(TrainConfig{});
  try {
    for (const Setting& s : settings()) {
      if (s.resume == Resume::Unrecorded || s.resume == Resume::Rechecked) continue;
      const std::string flag = s.flag;
      const Json* v = recorded.find(config_key(flag));
      if (!v) {
        if (s.absent) args.push_back(flag + "=" + s.absent);
      } else if (v->is_bool()) {  // (a switch off by default has no --no-FLAG)
        if (*v != defaults.at(config_key(flag))) args.push_back(v->as_bool() ? flag : "--no-" + flag.substr(2));
      } else if (!v->is_string() || !v->as_string().empty()) {  // (an empty string is the default: not given)
        args.push_back(flag + "=" + (v->is_string() ? v->as_string() : v->dump()));
      }
    }
    TrainConfig c = parse_settings(args);
    c.given_flags.clear();
    return c;
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": the recorded settings are invalid: ", e.what()));
  }
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = make_settings();
  return table;
}

const Setting* find_setting(std::string_view flag) {
  for (const Setting& s : settings())
    if (s.flag == flag) return &s;
  return nullptr;
}

std::string config_key(std::string_view flag) {
  std::string k(flag.substr(2));
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

void add_settings(CLI::App& app, TrainConfig& c) {
  for (const Setting& s : settings()) {
    std::string help = s.help;
    if (s.flag == std::string_view("--resume")) help += resume_rule();
    CLI::Option* o = s.field.add(app, c, s.flag, help);
    if (s.check) o->check(*s.check);
  }
}

void check_jobs(const TrainConfig& c) {
  CASTOR_CHECK(c.zero < 3 || family_of(c.model), "--zero 3: shards a language model's blocks; --model ", name(c.model),
               " has none");
  for (const std::string& flag : c.given_flags) {
    const Setting* s = find_setting(flag);
    if (!s) continue;
    const Family* family = family_of(c.model);
    const bool lm = family != nullptr;
    CASTOR_CHECK(s->job != Job::LanguageModel || lm, flag, ": applies to language models only (--model ",
                 presets_of(nullptr), "), not --model ", name(c.model));
    for (const Family& f : families())
      CASTOR_CHECK(s->job != f.job || family == &f, flag, ": applies to ", f.label, " models only (--model ",
                   presets_of(&f), "), not --model ", name(c.model));
    CASTOR_CHECK(s->job != Job::Image || !lm, flag, ": applies to image models only, not --model ", name(c.model));
    CASTOR_CHECK(s->job != Job::Folder || c.data == Dataset::Folder, flag,
                 ": applies to --data folder only, not "
                 "--data ",
                 name(c.data));
    CASTOR_CHECK(s->job != Job::Synthetic || c.data == Dataset::Synthetic, flag,
                 ": applies to --data synthetic "
                 "only, not --data ",
                 name(c.data));
  }
}

Json settings_json(const TrainConfig& c) {
  Json::Object o;
  for (const Setting& s : settings())
    if (s.resume != Resume::Unrecorded) o[config_key(s.flag)] = s.field.json(c);
  return o;
}

TrainConfig resume_config(const TrainConfig& given, const Json& recorded, const std::string& what) {
  TrainConfig c = parse_recorded_settings(recorded, what);
  const Json before = settings_json(c), now = settings_json(given);
  std::string differences;
  bool length_given = false;
  for (const std::string& flag : given.given_flags) {
    const Setting* s = find_setting(flag);
    if (!s) continue;
    length_given = length_given || s->resume == Resume::Length;
    if (may_change(*s, c)) continue;
    if (flag == "--optimizer" && given.optimizer != c.optimizer) {  // only adamw <-> adamw8bit, converting
      auto adamw = [](OptimizerKind k) { return k == OptimizerKind::AdamW || k == OptimizerKind::AdamW8bit; };
      CASTOR_CHECK(adamw(given.optimizer) && adamw(c.optimizer) && given.convert_optimizer_state, "--resume ", what,
                   ": --optimizer ", name(given.optimizer), " differs from the run's ", name(c.optimizer),
                   adamw(given.optimizer) && adamw(c.optimizer)
                       ? "; add --convert-optimizer-state to convert its optimizer state"
                       : "; only adamw and adamw8bit convert into each other (--convert-optimizer-state)");
      c.optimizer = given.optimizer;
      continue;
    }
    const std::string key = config_key(flag);
    const Json &was = before.at(key), &is = now.at(key);
    // (the recorded strings are paths, recorded absolute: the same file spelled differently is the same setting)
    if (was == is || (was.is_string() && !was.as_string().empty() && !is.as_string().empty() &&
                      absolute_path(was.as_string()) == absolute_path(is.as_string())))
      continue;
    differences += detail::cat(differences.empty() ? "" : "; ", flag, " ", is.dump(), " (recorded ", was.dump(), ")");
  }
  CASTOR_CHECK(differences.empty(), "--resume ", what, ": these settings differ from the run's: ", differences,
               "; a resumed run keeps them (start a new run with another --out to change them)");
  for (const Setting& s : settings())
    if (s.resume == Resume::Unrecorded || s.resume == Resume::Rechecked ||
        (may_change(s, c) && (given.given(s.flag) || (s.resume == Resume::Length && length_given))))
      s.field.take(c, given);
  c.given_flags = given.given_flags;
  if (const Json* sum = recorded.find("init_checksum"); sum && sum->is_string()) c.init_checksum = sum->as_string();
  if (const Json* d = recorded.find("model_config"); d && d->is_object()) c.model_config = *d;
  take_lora_patterns(c, recorded, what);
  if (const Json* v = recorded.find("real_vocab_size"); v && v->is_int()) c.real_vocab_size = v->as_int();
  c.vocab = recorded_vocabulary(recorded);
  c.vocab_of = c.vocab.known() ? what : "";
  check_jobs(c);
  return c;
}

const char* name(Dataset v) { return spelling(kDatasets, v); }
const char* name(ModelKind v) { return spelling(kModels, v); }
const char* name(OptimizerKind v) { return spelling(kOptimizers, v); }
const char* name(Schedule v) { return spelling(kSchedules, v); }
const char* name(Augment v) { return spelling(kAugments, v); }
const char* name(Compression v) { return spelling(kCompressions, v); }
const char* name(Recompute v) { return spelling(kRecomputes, v); }
const char* name(DataOrder v) { return spelling(kDataOrders, v); }
const char* name(backends::ConvAlgorithm v) { return spelling(kConvAlgorithms, v); }
bool is_language_model(ModelKind m) { return family_of(m) != nullptr; }
bool is_text(Dataset d) {
  return d == Dataset::Brown || d == Dataset::BrownChar || d == Dataset::BrownBpe || d == Dataset::Tokens;
}

}  // namespace castor::train
