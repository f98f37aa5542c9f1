// What the subcommands' CLI11 tables share: one set-up, the value checks, the flags several subcommands take,
// parsing with one-line errors and the flag list completion offers.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/check.h"
#include "castor/dtype.h"
#include "castor/json.h"

namespace castor::train {

// A subcommand's table: its description and name, each option taking its last value and showing its default.
std::unique_ptr<CLI::App> make_app(const std::string& description, const std::string& name);

// Parses `args` (argv after the subcommand); CLI11's errors become one castor::Error line, "--flag: problem", and an
// unknown flag names the nearest known one.
void parse_flags(CLI::App& app, std::vector<std::string> args, const std::string& command);
// "--a --b ..." of every long flag of `app`.
std::string flag_words(const CLI::App& app);

// Value checks, run on the flag's text before conversion (CLI11 prefixes the flag's name to the message).
CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open, const std::string& range);
CLI::Validator integer_in(int64_t min, int64_t max = int64_t{1} << 53);  // up to 2^53: exact in a double
CLI::Validator one_of(std::vector<std::string> choices);
const CLI::Validator& positive();
const CLI::Validator& non_negative();
const CLI::Validator& unit_interval();  // [0, 1)

// More OpenMP threads than this is no machine's (tens of thousands crash the OpenMP runtime).
constexpr int64_t kMaxThreads = 1024;

// The flags several subcommands take, defined once (their checks with them).
CLI::Option* add_threads(CLI::App& app, int& target, const std::string& help);    // 0..kMaxThreads
CLI::Option* add_seed(CLI::App& app, uint64_t& target, const std::string& help);  // 0..2^53
CLI::Option* add_init(CLI::App& app, std::string& target, const std::string& help);
CLI::Option* add_n_head(CLI::App& app, int64_t& target, const std::string& help);  // 0 (not given)..1024
CLI::Option* add_lora_base(CLI::App& app, std::string& target, const std::string& help);
// --chat-template FILE (tokenize --format chat, sample --chat): a template in place of the model's.
CLI::Option* add_chat_template(CLI::App& app, std::string& target);
// --lora DIR: a PEFT adapter directory applied to the model without a training run (castor sample and eval).
CLI::Option* add_lora(CLI::App& app, std::string& target, const std::string& help);
// --dtype: float32, bf16 or bfloat16, fp16 or float16 (castor eval's evaluation type, castor export's tensors).
CLI::Option* add_dtype(CLI::App& app, std::optional<DType>& target, const std::string& help);
// The help of --lora-base (its rule is the same everywhere).
constexpr const char* kLoraBaseHelp =
    "a LoRA run's base model file where it is now (it moved since the run recorded it); its checksum must be the "
    "recorded one";

// The spellings of an enumerated flag's values: the flag's choices, its help, config.json and name(); the first
// spelling of a value is its name.
template <class E>
struct Spelling {
  E value;
  const char* name;
};

template <class E, size_t N>
const char* spelling(const Spelling<E> (&table)[N], E v) {
  for (const Spelling<E>& s : table)
    if (s.value == v) return s.name;
  CASTOR_ASSERT(false, "an enum value without a spelling: ", static_cast<int>(v));
}

template <class E, size_t N>
std::vector<std::string> spellings(const Spelling<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const Spelling<E>& s : table) names.push_back(s.name);
  return names;
}

// An option whose text must be one of the table's spellings and sets `target` (E, or std::optional<E> where absent
// means not given) to its value.
template <class E, size_t N, class Target>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, Target& target, const Spelling<E> (&table)[N],
                        const std::string& help) {
  auto set = [&target, &table](const std::string& text) {
    for (const Spelling<E>& s : table)
      if (text == s.name) return void(target = s.value);
  };
  CLI::Option* o = app.add_option_function<std::string>(flag, set, help)->check(one_of(spellings(table)));
  if constexpr (std::is_same_v<Target, E>) o->default_str(spelling(table, target));
  return o;
}

// The tables of `castor sample` and `castor export` (src/train/sample.cpp, export.cpp), for completion.
struct SampleConfig;
struct ExportConfig;
std::unique_ptr<CLI::App> sample_app(SampleConfig& c);
std::unique_ptr<CLI::App> export_app(ExportConfig& c);
// castor export's formats, one row each (src/train/export.cpp): --format's name, the old flag that spells it, what
// it writes, and its writer (which reads --checkpoint itself: a LoRA run's adapters are written without the model).
struct ExportFormat {
  const char* name;
  const char* flag;
  const char* help;
  Json (*write)(const ExportConfig& c);
};
const std::vector<ExportFormat>& export_formats();
std::vector<std::string> export_format_names();

}  // namespace castor::train
