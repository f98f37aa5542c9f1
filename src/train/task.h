// What castor train and castor eval share: the Task a run learns from (an image classifier's or a language
// model's), the one evaluation loop over it, and the run's model, optimizer and opt level built from a config.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "castor/amp.h"
#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/llama.h"
#include "castor/lr_scheduler.h"
#include "castor/nn.h"
#include "castor/ddp.h"
#include "castor/optim.h"
#include "castor/serialize.h"
#include "castor/train_config.h"
#include "train/run_log.h"

namespace castor::train {

struct Evaluation {
  double loss = 0, accuracy = 0;   // mean loss per image or token; top-1 accuracy
  std::vector<int64_t> confusion;  // images: (K, K), row = true class, column = predicted class
  std::vector<std::pair<std::string, double>> task_scores;  // --eval-task's (task_score_keys(c) order), or none
};

// One batch: the model's input, the targets, its number in the epoch and how many examples (images or tokens, of
// this rank) it holds; a masked task's batch also how many of its targets count (not kIgnoreIndex).
struct Batch {
  Tensor input, target;
  int64_t index = 0;
  double examples = 0;
  double targets = 0;
};

// What a run learns from: its batches, its model, its evaluation set and what config.json, the epoch lines, the
// summary and castor eval show of it. An image classification task or a language-model task (make_task).
class Task {
 public:
  virtual ~Task() = default;
  virtual int64_t batches_per_epoch() const = 0;
  virtual void start_epoch(int64_t epoch, int64_t batch) = 0;
  virtual std::optional<Batch> next() = 0;  // none at the end of the epoch
  virtual nn::ModulePtr make_model(const TrainConfig& c) const = 0;
  // The parameters with weight decay, and those without.
  virtual std::pair<std::vector<Tensor>, std::vector<Tensor>> param_groups(const nn::Module& model) const {
    return {model.parameters(), {}};
  }
  // A training batch's loss (reduced as asked over its targets, with label smoothing; targets of data::kIgnoreIndex
  // left out), under the forward scope the caller opened: cross_entropy of the model's output; a language model's
  // without its logits held whole (lm_loss).
  virtual Tensor loss(nn::Module& model, const Batch& b, F::Reduction reduction, double label_smoothing) const;
  // An evaluation batch's summed loss (targets of data::kIgnoreIndex left out) and each example's predicted class
  // (argmax), the forward under amp's scope.
  virtual std::pair<double, std::vector<int64_t>> scores(nn::Module& model, const amp::Amp& amp, const Batch& b) const;
  // MFU's terms (none where the model's FLOPs are not estimated).
  virtual FlopRate flop_rate(const TrainConfig& c, const nn::Module& model) const { return {}; }

  // The evaluation set (test images, or the validation tokens in rows of the block size) in batches of
  // `batch_size` images or rows: their count and batch i.
  virtual int64_t eval_batches(int64_t batch_size) const = 0;
  virtual Batch eval_batch(int64_t i, int64_t batch_size) const = 0;
  virtual int64_t eval_batch_size() const = 0;       // training's, and castor eval's default
  virtual int64_t num_classes() const { return 0; }  // > 0: the evaluation counts a confusion matrix
  // Whether some targets are data::kIgnoreIndex (fine-tuning rows with a loss mask): the loss is then the mean over
  // the targets that count of the whole step (all micro-batches and ranks), as PyTorch's ignore_index=-100 over one
  // big batch.
  virtual bool masked() const { return false; }

  virtual void record(Json& config) const = 0;  // the data's facts, into config.json
  virtual const char* unit() const = 0;         // of examples/s: "img" or "tok"
  virtual const char* rate_key() const = 0;     // the metrics' throughput key: images_per_sec or tokens_per_sec
  // An evaluation's figures as the metrics record them, in metrics.csv's column order: test_loss and test_accuracy
  // of an image classifier, val_loss and val_perplexity of a language model (the keys do not depend on `ev`).
  virtual std::vector<std::pair<std::string, double>> evaluation_keys(const Evaluation& ev) const = 0;
  // A mid-epoch evaluation's figures, and the end-of-epoch line's, most important first.
  virtual std::vector<std::string> eval_fields(const Evaluation& ev) const = 0;
  virtual std::vector<std::string> epoch_fields(const Evaluation& ev, double train_loss) const = 0;
  // The summary's task-specific keys (`ev`: the newest evaluation, null before the first).
  virtual void summary_keys(Json& summary, const Evaluation* ev, double examples_per_sec) const {}
  // Per-class results for the report (null when the task has no classes) and the class names.
  virtual Json by_class(const Evaluation& ev) const { return Json(); }
  virtual std::vector<std::string> classes() const { return {}; }
  // castor eval's result, and what it prints before it (per class) on a terminal `width` columns wide.
  virtual Json eval_json(const Evaluation& ev) const = 0;
  virtual std::string eval_text(const Evaluation& ev, int width) const { return ""; }
};

// `new_run`: a run that starts now (not a resume or an evaluation), which reads --init; a language model's task
// resolves the config's vocabulary (and with --init its sizes).
std::unique_ptr<Task> make_task(TrainConfig& c, int rank, int world, bool new_run);
std::unique_ptr<Task> make_image_task(const TrainConfig& c, int rank, int world);
std::unique_ptr<Task> make_lm_task(TrainConfig& c, int rank, int world, bool new_run);

// castor eval: what the weights' file does not say of the run, taken into `c` before its task is made (`recorded`:
// the file's castor.config, null Json for weights without castor metadata, whose `file` tensors become the model's
// state dict), and the flags that do not apply to the task refused. A language model's: its vocabulary (recorded) or
// its sizes from the tensors' shapes (not), and --block-size's evaluation window; an image classifier's refuses --lora.
void take_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors& file, const Json& recorded);
void take_image_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors& file, const Json& recorded);
void take_lm_eval_settings(const EvalConfig& e, TrainConfig& c, LoadedTensors& file, const Json& recorded);
// The language model of a language-model config (its vocabulary resolved: c.vocab_size; a GPT's logits cover the first
// real_vocab of it) with weights drawn from `seed`: its family's (train/family.h).
std::shared_ptr<models::LanguageModel> make_language_model(const TrainConfig& c, int64_t real_vocab, uint64_t seed);
// The dataset directory: --data-dir, or the dataset's default location.
std::string data_dir(const TrainConfig& c);

// The vocabulary a run's recorded settings name: "tokenizer", "real_vocab_size" and "vocab_checksum" (runs of older
// builds: the size alone, or nothing).
data::VocabularyId recorded_vocabulary(const Json& recorded);
// The directory beside the model at `path` that holds its vocabulary as other tools keep it: a llama2.c model.bin's
// own directory when tokenizer.bin is there (run.c reads it from there), a Hugging Face directory itself when it
// holds tokenizer.json; "" otherwise.
std::string tokenizer_beside(const std::string& path);
// The vocabulary the model at `path` (a weights file or a Hugging Face directory; `recorded`: its castor.config, null
// when none) was trained in: the recorded one when it names its tokenizer or checksum, else tokenizer_beside's
// (with the recorded size, if any, when that is unknown too); unknown when neither says.
data::VocabularyId model_vocabulary(const std::string& path, const Json& recorded);
// The token directory a run trained on (`recorded`: its settings): its recorded data_dir, or setup's data/<name> for
// --data brown|brown-char|brown-bpe (data::setup_path: from any working directory); "" for none.
std::string recorded_data_dir(const Json& recorded);
// The directory holding the vocabulary of the model at `path` (castor.config `recorded`): its run's token folder
// (recorded_data_dir), which must still hold the vocabulary the run recorded (castor::Error naming both when it was
// tokenized again since), else tokenizer_beside's; "" when there is neither.
std::string model_tokenizer_dir(const std::string& path, const Json& recorded);
// castor tokenize --vocab PATH: a directory data::Tokenizer::load reads, as it is; a run or checkpoint directory, or a
// model file (a Castor safetensors, a llama2.c model.bin): model_tokenizer_dir's. castor::Error naming the flag when
// PATH holds no vocabulary.
std::string vocabulary_dir(const std::string& path);
// c.vocab and c.vocab_of: model_vocabulary's (with c.real_vocab_size when that leaves the size unknown), of `path`.
void take_model_vocabulary(TrainConfig& c, const std::string& path, const Json& recorded);
// A one-line castor::Error unless the token folder `dir` (`flag`, "--data-dir" or "--data NAME", names it) holds the vocabulary
// `c.vocab` (the model's, of c.vocab_of) as far as both are known; both sides named, with the way out. Returns the
// folder's vocabulary (data::folder_vocabulary's).
data::VocabularyId check_folder_vocabulary(const TrainConfig& c, const std::string& dir, const std::string& flag);

// Loss, accuracy (and the confusion matrix) of `model` over the task's evaluation set; with several ranks each
// evaluates every world_size-th batch and the sums are all-reduced. With `idle` (ZeRO-3, whose forward gathers each
// block from every rank) every rank takes the same number of turns, and a turn past the last batch calls idle()
// (nn::ShardedBlocks::gather_each: the same gathers without the compute) instead of a forward.
Evaluation evaluate(const Task& task, nn::Module& model, const amp::Amp& amp, int64_t batch_size,
                    const std::function<void()>& idle = nullptr);

// The run's model, optimizer, opt level and scheduler, built from a config.
struct Run {
  nn::ModulePtr model;
  std::shared_ptr<nn::DistributedDataParallel> ddp;  // with more than one rank: wraps model
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  std::unique_ptr<optim::LRScheduler> sched;
  std::shared_ptr<nn::ShardedBlocks> zero3;  // --zero 3 with several ranks: the blocks' weights sharded
};

// `load_init`: load --init's weights (a new run; a checkpoint's weights replace them, so resume and eval do not read
// the file, which may be gone by then): the model is made without weights of its own (nn::LoadInitGuard; a LoRA run's
// frozen base at O1-O3 directly in the 16-bit dtype) and loads the file tensor by tensor (formats::load_weights_into:
// a safetensors file with PyTorch's names, llm.c's, llama2.c's, a Hugging Face directory), never in float32 first.
Run build_run(const TrainConfig& c, const Task& task, int64_t total_steps, bool load_init);

// (trainable, all) parameter values of `model`, a tied parameter once (PEFT's print_trainable_parameters counts).
std::pair<int64_t, int64_t> parameter_counts(const nn::Module& model);
// PEFT's print_trainable_parameters line: "trainable params: 1,234 || all params: 5,678 || trainable%: 21.7307".
std::string trainable_parameters_text(int64_t trainable, int64_t all);
std::string trainable_parameters_text(const nn::Module& model);
// --recompute: a language model's blocks recomputed (blocks), or not (none), or (auto) blocks only where the run's
// estimated peak without them passes --memory-budget: the model's and optimizer's bytes now, the optimizer's
// states to come, and one forward and backward's peak above them, measured on rows of 16, 32 and 64 tokens and
// fitted as a + b T + c T^2 per row. A budget that fits neither is refused, naming the smallest that would. Returns
// what it chose, for the log ("" for a model without blocks).
std::string apply_recompute(const TrainConfig& c, const Task& task, Run& run);
// --zero 3 with several ranks, once the run's weights are in place (a resumed run's loaded): each rank keeps its
// slice of every weight of the language model's blocks (nn::ShardedBlocks, the optimizer's slices), gathered per
// block as it runs (LanguageModel::set_block_hooks). castor::Error for a model without blocks.
// With --zero 3 and several ranks a full fine-tuning's blocks are sharded by build_run as the model is built (each
// block drawn or read, cast, its slice of rank 0's values kept and the rest freed before the next: DeepSpeed's
// zero.Init), so this only shards a LoRA run's.
void apply_zero3(const TrainConfig& c, Run& run);
// A model file's tensors (a checkpoint's) into `model`, whose blocks ZeRO-3 sharded as it was built: each block
// parameter's slice into the slice this rank keeps (nn::ShardedBlocks::load), the rest loaded as
// Module::load_state_dict does strictly; castor::Error naming a missing, unexpected or misshapen tensor.
void load_sharded_model(nn::Module& model, nn::ShardedBlocks& zero3, const StateDict& tensors);
// The element count ZeRO's slices start at multiples of: the optimizer's (Optimizer::shard_alignment, AdamW8bit's
// block size) before it is made.
int64_t shard_alignment(const TrainConfig& c);

// One figure in printf's format: figure("val loss %.4f", 2.5) is "val loss 2.5000".
std::string figure(const char* format, double value);

// What ran: Castor's version and commit, the host CPU and its ISA (config.json, summary.json, the report's header).
Json build_json();
// "2026-11-25T14:05:09Z".
std::string utc_now();
// What config.json and every checkpoint record: the settings, the thread count used, the schedule's length and the
// data's facts.
Json config_json(const TrainConfig& c, const Task& task, int64_t schedule_steps);

}  // namespace castor::train
