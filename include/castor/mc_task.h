// Multiple-choice evaluation tasks as text: the JSONL layouts HellaSwag, MMLU, ARC, PIQA and Winogrande are published
// in (and a plain {context, choices, label}), rendered into the prompts and continuations lm-evaluation-harness scores.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "castor/json.h"

namespace castor::data {

enum class McFormat { HellaSwag, Mmlu, Arc, Piqa, Winogrande, Choices };
const char* mc_format_name(McFormat f);
std::vector<std::string> mc_format_names();
// castor::Error naming `flag` for a name not in mc_format_names().
McFormat parse_mc_format(const std::string& name, const std::string& flag = "--task-format");
// The layout a row's fields say it is in (HellaSwag: ctx_a/endings; MMLU: question/choices/answer; ARC: answerKey;
// PIQA: goal/sol1/sol2; Winogrande: sentence/option1/option2; plain: context/choices/label); nullopt when none.
std::optional<McFormat> infer_mc_format(const Json& row);

// One row as lm-eval's multiple-choice requests: choice i is scored as the log-likelihood of continuation(i) after
// context(i). Most tasks share one context across the choices (contexts.size() == 1, a continuation per choice:
// target_delimiter " " + the choice); Winogrande's partial scoring has a context per choice (the sentence up to its
// blank, filled with the option) and one shared continuation (" " + the rest of the sentence).
struct McDoc {
  int64_t line = 0;                        // 1-based line in its file
  std::vector<std::string> contexts;       // the fewshot prefix included
  std::vector<std::string> continuations;  // target_delimiter included
  std::vector<std::string> choices;        // the choices as doc_to_choice gives them (acc_norm's lengths)
  int64_t gold = 0;
  std::string subject;  // MMLU's (empty for the others)
  std::string row;      // the JSON row as read, its keys sorted (lm-eval's `x != doc` compares the rows)

  int64_t n_choices() const { return static_cast<int64_t>(choices.size()); }
  const std::string& context(int64_t i) const { return contexts.size() == 1 ? contexts[0] : contexts[i]; }
  const std::string& continuation(int64_t i) const {
    return continuations.size() == 1 ? continuations[0] : continuations[i];
  }
};

// One row rendered without fewshot examples. castor::Error naming `where` ("FILE: line N") for a row without its
// fields, a label that is missing or out of range, a Winogrande sentence without its blank.
McDoc render_mc_row(const Json& row, McFormat format, const std::string& where);

// The text a row adds as a fewshot example: doc_to_text + " " + the gold choice (Winogrande: the filled sentence
// start + " " + the rest).
std::string mc_fewshot_example(const McDoc& doc);

// lm-eval's fewshot samplers (a task's fewshot_config.sampler): "default" draws the examples at random
// (random.Random(fewshot_seed).sample, one generator across a task's rows in order), "first_n" takes the first rows.
enum class FewshotSampler { Random, FirstN };
const char* fewshot_sampler_name(FewshotSampler s);
FewshotSampler parse_fewshot_sampler(const std::string& name, const std::string& flag = "--fewshot-sampler");

struct McTaskOptions {
  std::optional<McFormat> format;         // nullopt: inferred from the first row
  int64_t num_fewshot = 0;                // examples before each prompt, from fewshot_file
  std::string fewshot_file;               // JSONL of the same layout (MMLU: the examples of a row are of its subject)
  std::optional<FewshotSampler> sampler;  // nullopt: the task's (MMLU's first_n, the others' default)
  uint64_t fewshot_seed = 1234;           // lm-eval's fewshot_random_seed
  int64_t limit = 0;                      // > 0: the first `limit` rows only
};
struct McTask {
  std::string path;
  McFormat format = McFormat::Choices;
  std::vector<McDoc> docs;
  FewshotSampler sampler = FewshotSampler::Random;  // the sampler that drew the examples (options' or the task's)
};
// Reads and renders a task file: MMLU's description line ("The following are multiple choice questions (with
// answers) about {subject, _ as space}.\n\n") first, then the fewshot examples each followed by "\n\n", then the
// prompt. The examples are drawn as lm-eval's samplers draw them: one more than asked (the random draw's, or first_n's
// first rows), the row itself then dropped wherever it is among them (so a row listed twice leaves one example
// fewer, as in lm-eval), where lm-eval hands its sampler the evaluated row (a task whose fewshot split is its test
// split: HellaSwag's, PIQA's and Winogrande's configurations, and plain rows whose fewshot file is the task file).
// castor::Error naming the file and line: not JSON, a row in another layout, the errors of render_mc_row; an empty
// file; fewer fewshot rows than the draw needs.
McTask read_mc_task(const std::string& path, const McTaskOptions& opt);

// Calls fn(row, line, where) for each non-blank line of a JSONL file (line: 1-based; where: "PATH: line N");
// castor::Error naming the line when one is not JSON. Returns the number of rows.
int64_t for_each_jsonl_row(const std::string& path,
                           const std::function<void(const Json&, int64_t, const std::string&)>& fn);

// Python's len() of UTF-8 text: its code points (lm-eval's acc_norm divides by it).
int64_t code_points(std::string_view utf8);

}  // namespace castor::data
