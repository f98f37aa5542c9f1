// LoRA runs of castor train: adapter settings (flags or a PEFT directory), the frozen base's checksum, checkpoints
// holding the adapters only, and PEFT's adapter_config.json + adapter_model.safetensors.
#pragma once
#include <memory>
#include <string>

#include "castor/checkpoint.h"
#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/lora.h"
#include "castor/train_config.h"

namespace castor::train {

// --init RUN or RUN/checkpoints/step-N: the newest (or that) checkpoint's model.safetensors. castor::Error for a
// directory without a checkpoint, or a LoRA run's (its model file holds adapters only: merge it first). A Hugging
// Face directory (config.json) stays as it is.
void resolve_init_dir(TrainConfig& c);
// The LoRA flags' rules, after parsing: --lora-alpha and the others need --lora-rank (or --init-lora, whose
// adapter_config.json then gives them: a given flag that differs is an error) and LoRA needs --init.
void check_lora_flags(TrainConfig& c);
// A LoRA run resumed or evaluated (c.init_checksum recorded): castor::Error unless --init still has that checksum (a
// changed base is refused: the adapters fit only the base they were trained on).
void check_lora_base(const TrainConfig& c);
// Loads the LoRA base `path` into `model` (formats::load_weights_into). With --quantize-base, each Linear but the
// output layer whose rows are whole blocks of the type is quantized as soon as its weight is filled and its dense
// weight dropped, so the dense base is never whole in memory; the others (rows of another length) stay dense. A
// GGUF base's Linear weights stored quantized stay in the file's blocks (the output layer's too), never dense.
void load_base(nn::Module& model, const std::string& path, const TrainConfig& c);
// Adapts the model built from --init as `c` says and loads --init-lora's adapters.
void apply_run_lora(const TrainConfig& c, nn::Module& model);
// castor sample|eval --lora DIR: the PEFT adapter directory DIR (adapter_config.json, adapter_model.safetensors) on
// `model`, the `kind` model of `base` (a weights file, Hugging Face directory or GGUF file), read as --init-lora reads
// it: merged into the weights (nn::merge_and_unload), or, where an adapted Linear holds quantized blocks (a GGUF
// file's), kept beside them unmerged (the same function; the blocks stay as they are). castor::Error naming the file
// for adapters that do not fit the model.
void apply_peft_adapter(nn::Module& model, ModelKind kind, const std::string& base, const std::string& dir);

// Makes a checkpoint of a LoRA run (config's lora_rank > 0) hold only the adapters, with "castor.lora_base" (the base
// file) in its metadata.
void keep_adapters(Checkpoint& ck, const Json& config);
bool is_lora_checkpoint(const Metadata& meta);
// A new LoRA run (rank 0) whose --init is a run's checkpoint: adds the run's directory to that checkpoint's
// kLoraRunsFile, so the base run's --keep pruning leaves it (a note when the file cannot be written).
void pin_lora_base(const TrainConfig& c);
// Loads a checkpoint's model file into `model`: strictly, or for a LoRA checkpoint its adapters (exactly the model's
// adapter keys and shapes; the base is loaded already). castor::Error naming `what`.
void load_model_file(nn::Module& model, const StateDict& tensors, const Metadata& meta, const std::string& what);
// Turns a LoRA checkpoint's model file into the merged model's, as a full run's checkpoint holds it: the recorded base
// (a GPT or a Llama; checksum checked), its adapters merged (nn::merge_and_unload), and castor.config a plain run's
// (no LoRA settings), so castor eval, sample and train --init take the merged file.
// `lora_base` (--lora-base; empty: the recorded one): the base file moved, checked against the recorded checksum.
void merge_lora_checkpoint(Checkpoint& ck, const std::string& what, const std::string& lora_base = "");

// Where a LoRA checkpoint's base is now: `lora_base` (--lora-base), else the recorded one.
std::string lora_base_of(const Checkpoint& ck, const std::string& lora_base);
// A LoRA checkpoint's base language model (a GPT or a Llama, as its recorded settings describe; `lora_base`: where the
// base is now, empty: the recorded one; its checksum checked) with the checkpoint's adapters on it.
std::shared_ptr<models::LanguageModel> adapted_model(const Checkpoint& ck, const std::string& what,
                                                     const std::string& lora_base);
// Whether a LoRA checkpoint's base loads in blocks (adapted_model): a GGUF file, or a base the run quantized
// (--quantize-base).
bool base_in_blocks(const Checkpoint& ck, const std::string& what, const std::string& lora_base);
// The LoRA settings a LoRA checkpoint's run recorded (rank, alpha, rslora, targets).
nn::LoraConfig run_lora_config(const Checkpoint& ck, const std::string& what);

// The checksum a run records of its --init (a LoRA run's base is checked against it): a weights file's bytes', or a
// Hugging Face directory's config.json, index and safetensors files'.
std::string weights_checksum(const std::string& path);

// PEFT's pair of files as the directory `dir` (named by `flag`): adapter_model.safetensors ("base_model.model.<path>
// .lora_A.weight" (r, in), "...lora_B.weight" (out, r), float32) and adapter_config.json (r, lora_alpha,
// lora_dropout, target_modules, use_rslora, base_model_name_or_path, ...), written whole (castor/fs.h's
// write_output_dir: a directory holding other files, a run directory or a symbolic link is refused).
void write_peft(const std::string& flag, const std::string& dir, const Checkpoint& ck, const std::string& what,
                const std::string& lora_base = "");
// --init-lora's per-module ranks and alphas (c.lora_rank_pattern, c.lora_alpha_pattern) into a run's config.json, when
// it has them, as [[key, value], ...] in their order; and back from a recorded config (`what` names it in errors).
void record_lora_patterns(const TrainConfig& c, Json& config);
void take_lora_patterns(TrainConfig& c, const Json& recorded, const std::string& what);
// Whether `name` is one of the files write_peft writes.
bool is_peft_file(const std::string& name);

}  // namespace castor::train
