// The settings of `castor train`, one row each: the flags, config.json, the resume rules and the per-job checks are
// all derived from this table. Adding a setting is one row here (and its TrainConfig member) plus its use.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "castor/json.h"
#include "castor/train_config.h"
#include "train/cli.h"

namespace castor::train {

// The spellings of the datasets and models (castor train and castor eval take them).
inline constexpr Spelling<Dataset> kDatasets[] = {{Dataset::FashionMnist, "fashion-mnist"},
                                                  {Dataset::Cifar10, "cifar10"},
                                                  {Dataset::Synthetic, "synthetic"},
                                                  {Dataset::Folder, "folder"},
                                                  {Dataset::Brown, "brown"},
                                                  {Dataset::BrownChar, "brown-char"},
                                                  {Dataset::BrownBpe, "brown-bpe"},
                                                  {Dataset::Tokens, "tokens"}};
inline constexpr Spelling<ModelKind> kModels[] = {
    {ModelKind::SimpleCnn, "simplecnn"}, {ModelKind::ResNet18, "resnet18"},
    {ModelKind::ResNet9, "resnet9"},     {ModelKind::Gpt, "gpt"},
    {ModelKind::GptMini, "gpt-mini"},    {ModelKind::Gpt2, "gpt2"},
    {ModelKind::Llama, "llama"},         {ModelKind::Llama260k, "llama-260k"},
    {ModelKind::Llama15m, "llama-15m"}};

// What `castor train --resume` does with a setting given again.
enum class Resume {
  Fixed,                    // recorded; a different value is refused
  Free,                     // recorded; the value given now replaces it (for instance --log-every)
  Length,                   // recorded; --steps/--epochs, taken together when either is given (to extend)
  FreeUnlessDeterministic,  // --threads: free, except for a --deterministic run
  Unrecorded,               // not in config.json (--out, --resume, ...): the value given now
  Rechecked,                // --nproc: recorded, not read back; the value given now (run_train checks it against
                            // the recorded global batch)
};

// The jobs a setting applies to; given to another job it is refused, naming the flag.
enum class Job { Any, Image, Folder, Synthetic, LanguageModel, Gpt, Llama };

// How a setting reads and writes its TrainConfig member (made by the templates in settings.cpp).
struct Field {
  CLI::Option* (*add)(CLI::App& app, TrainConfig& c, const std::string& flag, const std::string& help);
  Json (*json)(const TrainConfig& c);
  void (*take)(TrainConfig& to, const TrainConfig& from);
  std::vector<std::string> (*choices)();  // an enumerated setting's spellings; null for the others
};

struct Setting {
  const char* flag;  // "--weight-decay"; its config.json key is "weight_decay"
  Field field;
  const char* help;
  const CLI::Validator* check;  // null: any value the member's type takes (or checked by the field)
  Resume resume;
  Job job;
  const char* absent = nullptr;  // the value a config.json without the key means (runs recorded before it existed)
};

// The table, in the order `castor train --help` lists it.
const std::vector<Setting>& settings();
// The row of `flag` ("--lr"), or null.
const Setting* find_setting(std::string_view flag);
// "weight_decay" of "--weight-decay".
std::string config_key(std::string_view flag);
// Adds every setting's flag to `app`, bound to `c`.
void add_settings(CLI::App& app, TrainConfig& c);
// `castor train` flags parsed, with the language-model defaults, but not checked against the job (a run's recorded
// settings hold every flag); parse_train_flags is this and check_jobs for a new run.
TrainConfig parse_settings(const std::vector<std::string>& args);
// Refuses a flag given to a job it does not apply to (`castor train --model simplecnn --n-head 3`).
void check_jobs(const TrainConfig& c);

}  // namespace castor::train
