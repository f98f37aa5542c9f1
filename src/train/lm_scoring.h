// Log-likelihoods of continuations as lm-evaluation-harness's Hugging Face backend computes them, the multiple-choice
// metrics over them (acc, acc_norm, llm.c's token mean, standard errors, MMLU's subjects) and llama.cpp's
// perplexity: what castor eval --task / --text and castor train --eval-task compute.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castor/amp.h"
#include "castor/chat_data.h"
#include "castor/json.h"
#include "castor/language_model.h"
#include "castor/mc_task.h"
#include "castor/tokenizer.h"
#include "castor/train_config.h"

namespace castor::train {

// A continuation to score after a context, as token ids.
struct LlRequest {
  std::vector<int64_t> context, continuation;
};

// The tokens lm-eval gives an empty context (its prefix_token_id: the tokenizer's BOS, else its end-of-text token;
// -1 when it has neither, a char tokenizer's).
int64_t prefix_token(const data::Tokenizer& tok);

// lm-eval's _encode_pair: the context's trailing whitespace moved to the continuation, context + continuation encoded
// whole and split at the context's own token count (BOS only with `add_bos`, as its add_bos_token=True); an empty
// context becomes `prefix` (unless the continuation starts with it). castor::Error naming `where` when the
// continuation encodes to no token or `prefix` is -1 for an empty context.
LlRequest encode_request(data::Tokenizer& tok, std::string context, std::string continuation, bool add_bos,
                         int64_t prefix, const std::string& where);

// Scores requests on a model without autograd: the summed log-probability of each continuation's tokens. Requests with
// equal context tokens (a row's choices) share one computation of the context: one forward runs the context and their
// continuations after it (models::forward_runs: each continuation reads the context's keys and values, none copied),
// so each layer multiplies once over the context's and the continuations' tokens; continuations that do not fit the
// cache with it run in further forwards after the context kept there. A request longer than block_size + 1 tokens is
// cut from the left as lm-eval does ((context + continuation)[-(block_size + 1):][:-1] read; castor::Error when the
// continuation alone passes block_size).
class LlScorer {
 public:
  explicit LlScorer(models::LanguageModel& model) : model_(model) {}
  std::vector<double> score(const std::vector<LlRequest>& requests);
  int64_t truncated() const { return truncated_; }  // requests cut from the left so far
  int64_t tokens() const { return tokens_; }        // positions run through the model so far

 private:
  models::KVCache& cache();  // made at first use
  models::LanguageModel& model_;
  std::optional<models::KVCache> cache_;
  int64_t truncated_ = 0, tokens_ = 0;
};

// One row's scores: each choice's log-likelihood and its continuation's token count.
struct McScore {
  std::vector<double> loglik;
  std::vector<int64_t> tokens;
};
// A row's requests, encoded with `prefix` for an empty context (errors name its line in `path`).
std::vector<LlRequest> mc_requests(data::Tokenizer& tok, const data::McDoc& doc, bool add_bos, int64_t prefix,
                                   const std::string& path);

// Whether the row is answered right by acc (argmax of the log-likelihoods, the first of equal ones), acc_norm (of
// the log-likelihood over the choice's length in characters, lm-eval's) and acc_norm_tokens (over its token count,
// llm.c's hellaswag.py).
struct McCorrect {
  bool acc, acc_norm, acc_norm_tokens;
};
McCorrect mc_correct(const data::McDoc& doc, const McScore& score);

// The results of a task as lm-eval names them: {"task", "samples", "acc,none", "acc_stderr,none", "acc_norm,none",
// "acc_norm_stderr,none", "acc_norm_tokens,none", "acc_norm_tokens_stderr,none"}; the standard error of the mean
// (sample standard deviation / sqrt(n), null for one row). MMLU also "subjects" {name: {"acc,none",
// "acc_stderr,none", "samples"}}, "acc,none" over all rows as lm-eval's group (its pooled standard error) and
// "acc_macro,none", the mean of the subjects'.
Json mc_results(const data::McTask& task, const std::vector<McScore>& scores);
// The human table of mc_results (one line a metric; MMLU a line a subject).
std::string mc_table(const Json& results);

// Scores every row of a task, calling progress(rows done) after each.
std::vector<McScore> score_mc_task(models::LanguageModel& model, data::Tokenizer& tok, const data::McTask& task,
                                   bool add_bos, LlScorer& scorer, const std::function<void(int64_t)>& progress);

// llama.cpp's llama-perplexity: `tokens` (BOS first where the tokenizer adds one: `bos` >= 0) cut into
// len / ctx non-overlapping chunks of ctx tokens, each chunk's first token set to bos (when >= 0), each scored on
// positions ctx/2 .. ctx-1 (predicted from the positions before, the first half context only).
struct Perplexity {
  double nll = 0, perplexity = 0;  // mean negative log-likelihood per scored token, exp of it
  int64_t tokens = 0, chunks = 0;  // scored tokens, chunks
};
// castor::Error when ctx passes block_size or the tokens hold fewer than 2 ctx (llama-perplexity's rule).
Perplexity perplexity(models::LanguageModel& model, std::vector<int64_t> tokens, int64_t ctx, int64_t bos);

// castor train --eval-task: the task read once, in the run's tokenizer (its token folder's), and scored on the model
// under the run's autocast at each evaluation; castor::Error naming --eval-task when it cannot be read. A held-out
// file of chat data (castor tokenize --format's chat, prompt-completion or alpaca rows) is rendered and tokenized as
// castor tokenize does (the folder's chat template, the loss mask on the answers, each example in a row of its own cut
// to the block size) and scored as the validation loss is: the mean negative log-likelihood of its target tokens.
class TrainTaskScorer {
 public:
  explicit TrainTaskScorer(const TrainConfig& c);
  // task_score_keys(c) with their values: acc, acc_norm and acc_norm_tokens over the task's rows, or a chat task's
  // loss and perplexity.
  std::vector<std::pair<std::string, double>> score(models::LanguageModel& model, const amp::Amp& amp);

 private:
  std::vector<std::pair<std::string, double>> score_chat(models::LanguageModel& model);
  data::McTask task_;
  std::unique_ptr<data::Tokenizer> tok_;
  std::vector<data::TokenizedText> chat_;  // a chat task's examples (empty: a multiple-choice task)
  int32_t pad_id_ = 0;
};
// The layout of a held-out chat file given to --eval-task: --task-format's when it names castor tokenize's chat,
// prompt-completion or alpaca, else the first row's fields' (messages or conversations, prompt and completion,
// instruction and output); nullopt for a multiple-choice task. castor::Error naming --eval-task when unreadable.
std::optional<data::ChatFormat> chat_task_format(const std::string& path, const std::string& task_format);
// The metrics.jsonl keys of --eval-task's figures: task_acc, task_acc_norm, task_acc_norm_tokens; a chat task's
// task_loss and task_perplexity.
std::vector<std::string> task_score_keys(const TrainConfig& c);

// castor eval MODEL --task FILE: mc_results (with "checkpoint", "num_fewshot", "fewshot_seed", "fewshot_sampler" (the
// task's where not given) and "truncated", the requests cut from the left), the table on stderr, a progress line with the time left on long runs; --log-samples' file written whole.
Json run_task_eval(const EvalConfig& e);
// castor eval MODEL --text FILE: {"perplexity", "nll", "tokens", "chunks", "ctx", "checkpoint", "text"}.
Json run_perplexity_eval(const EvalConfig& e);

}  // namespace castor::train
