// `castor eval MODEL --task FILE` (lm-evaluation-harness's multiple-choice scoring) and `--text FILE` (llama.cpp's
// perplexity) on any language model castor reads.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>

#include "castor/autocast.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "train/loaded_model.h"
#include "train/lm_scoring.h"
#include "train/progress.h"

namespace castor::train {

namespace {

// The autocast castor eval runs `model` under: a 16-bit model's dtype (as castor sample runs it), or --dtype bf16/fp16
// over float32 weights.
void start_autocast(const EvalConfig& e, const models::LanguageModel& model, std::optional<amp::AutocastGuard>& guard) {
  const DType weights = model.cache_shape().dtype;
  if (is_16bit_float(weights))
    guard.emplace(weights, true);
  else if (e.dtype && is_16bit_float(*e.dtype))
    guard.emplace(*e.dtype, true);
}

// A progress line on stderr at most every 2 seconds once a run passes 2 seconds: rows done, throughput and the time
// left (rewritten in place on a terminal).
class ProgressLine {
 public:
  ProgressLine(std::string what, int64_t total) : what_(std::move(what)), total_(total) {}
  void update(int64_t done, int64_t tokens) {
    const double t = seconds();
    if (t - last_ < 2 || done == total_) return;
    last_ = t;
    const double left = t / static_cast<double>(done) * static_cast<double>(total_ - done);
    std::fprintf(stderr, "%s%s: %lld/%lld rows  %.0f tok/s  %s<%s%s", tty_ ? "\r" : "", what_.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), static_cast<double>(tokens) / t,
                 clock_text(t).c_str(), clock_text(left).c_str(), tty_ ? "" : "\n");
    shown_ = true;
  }
  void finish() {
    if (shown_ && tty_) std::fputc('\n', stderr);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::string what_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_ = 0;
  bool tty_ = isatty(STDERR_FILENO), shown_ = false;
};

}  // namespace

Json run_task_eval(const EvalConfig& e) {
  data::McTaskOptions opt;
  if (!e.task_format.empty()) opt.format = data::parse_mc_format(e.task_format);
  opt.num_fewshot = e.num_fewshot, opt.fewshot_file = e.fewshot_file, opt.limit = e.limit;
  if (!e.fewshot_sampler.empty()) opt.sampler = data::parse_fewshot_sampler(e.fewshot_sampler);
  opt.fewshot_seed = e.fewshot_seed;
  CASTOR_CHECK(e.fewshot_seed <= static_cast<uint64_t>(INT64_MAX), "--fewshot-seed ", e.fewshot_seed,
               ": at most 2^63 - 1 (the seed is recorded in the output)");
  if (!e.log_samples.empty()) check_replaceable(e.log_samples);  // (refused before any work)
  const data::McTask task = data::read_mc_task(e.task, opt);
  LoadedLm lm = load_language_model(e.path, e.n_head, e.lora_base, e.tokenizer_dir, e.lora);
  std::optional<amp::AutocastGuard> autocast;
  start_autocast(e, *lm.model, autocast);
  LlScorer scorer(*lm.model);
  ProgressLine progress("castor eval " + e.task, static_cast<int64_t>(task.docs.size()));
  const std::vector<McScore> scores = score_mc_task(*lm.model, lm.tokenizer, task, e.add_bos, scorer,
                                                    [&](int64_t done) { progress.update(done, scorer.tokens()); });
  progress.finish();
  Json out = mc_results(task, scores);
  out["checkpoint"] = e.path;
  out["num_fewshot"] = e.num_fewshot;  // (lm-eval's n-shot, its fewshot_seed and fewshot_config.sampler)
  out["fewshot_seed"] = e.fewshot_seed;
  out["fewshot_sampler"] = data::fewshot_sampler_name(task.sampler);
  out["truncated"] = scorer.truncated();
  out["tokens_per_sec"] = static_cast<double>(scorer.tokens()) / std::max(progress.seconds(), 1e-9);
  if (scorer.truncated() > 0)
    std::fprintf(stderr,
                 "castor eval: %lld requests were longer than the model's context of %lld tokens and were cut "
                 "from the left, as lm-evaluation-harness does\n",
                 static_cast<long long>(scorer.truncated()), static_cast<long long>(lm.model->block_size()));
  std::fputs(mc_table(out).c_str(), stderr);
  if (!e.log_samples.empty()) {
    std::string lines;
    for (size_t i = 0; i < scores.size(); ++i) {
      const McCorrect c = mc_correct(task.docs[i], scores[i]);
      Json::Array ll(scores[i].loglik.begin(), scores[i].loglik.end()), tokens;
      for (int64_t t : scores[i].tokens) tokens.push_back(t);
      lines += Json(Json::Object{{"doc_id", static_cast<int64_t>(i)},
                                 {"line", task.docs[i].line},
                                 {"target", task.docs[i].gold},
                                 {"loglikelihoods", std::move(ll)},
                                 {"tokens", std::move(tokens)},
                                 {"acc", c.acc ? 1 : 0},
                                 {"acc_norm", c.acc_norm ? 1 : 0},
                                 {"acc_norm_tokens", c.acc_norm_tokens ? 1 : 0}})
                   .dump() +
               "\n";
    }
    atomic_write_file(e.log_samples, lines);
  }
  return out;
}

Json run_perplexity_eval(const EvalConfig& e) {
  const std::vector<uint8_t> bytes = read_file(e.text);
  LoadedLm lm = load_language_model(e.path, e.n_head, e.lora_base, e.tokenizer_dir, e.lora);
  std::optional<amp::AutocastGuard> autocast;
  start_autocast(e, *lm.model, autocast);
  data::Tokenizer& tok = lm.tokenizer;
  std::vector<uint32_t> ids;
  try {
    ids = tok.encode(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), true);
  } catch (const Error& err) {
    throw Error(detail::cat("--text ", e.text, ": ", err.what()));
  }
  // llama-perplexity sets each chunk's first token to BOS where the tokenizer adds one (llama_vocab_get_add_bos).
  const std::vector<uint32_t> bos = tok.encode("", true);
  const int64_t ctx = e.ctx > 0 ? e.ctx : lm.model->block_size();
  const Perplexity p = perplexity(*lm.model, {ids.begin(), ids.end()}, ctx,
                                  bos.empty() ? -1 : static_cast<int64_t>(bos[0]));
  std::fprintf(stderr, "perplexity %.4f over %lld tokens (%lld chunks of %lld)\n", p.perplexity,
               static_cast<long long>(p.tokens), static_cast<long long>(p.chunks), static_cast<long long>(ctx));
  return Json::Object{
      {"perplexity", p.perplexity}, {"nll", p.nll},  {"tokens", p.tokens}, {"chunks", p.chunks}, {"ctx", ctx},
      {"checkpoint", e.path},       {"text", e.text}};
}

}  // namespace castor::train
