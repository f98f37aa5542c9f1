// Log-likelihood scoring (lm-evaluation-harness's Hugging Face backend), multiple-choice metrics and llama.cpp's
// perplexity (train/lm_scoring.h).
#include "train/lm_scoring.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "castor/chat_data.h"
#include "castor/autograd.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "train/task.h"

namespace castor::train {

namespace {

// Python's str.isspace() over ASCII (what rstrip() removes).
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

std::vector<int64_t> encode(data::Tokenizer& tok, const std::string& text, bool add_special) {
  const std::vector<uint32_t> ids = tok.encode(text, add_special);
  return {ids.begin(), ids.end()};
}

Tensor ids_tensor(const std::vector<double>& ids, int64_t rows) {
  return tensor(ids, Shape{rows, static_cast<int64_t>(ids.size()) / rows}, DType::Int64);
}

// log softmax(row)[token] over the real vocabulary, in double.
double log_prob(const float* row, int64_t vocab, int64_t token) {
  float max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  return static_cast<double>(row[token]) - max - std::log(sum);
}

// Logits (..., output width) as float32 over the real vocabulary, contiguous.
Tensor real_logits(const Tensor& logits, int64_t vocab) {
  return logits.narrow(logits.dim() - 1, 0, vocab).to(DType::Float32).contiguous();
}

int64_t argmax(const std::vector<double>& v) {
  int64_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int64_t>(i);
  return best;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// lm-eval's mean_stderr: the sample standard deviation over sqrt(n); null for fewer than two values.
Json stderr_of(const std::vector<double>& v) {
  if (v.size() < 2) return nullptr;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  const double n = static_cast<double>(v.size());
  return std::sqrt(ss / (n - 1)) / std::sqrt(n);
}

}  // namespace

int64_t prefix_token(const data::Tokenizer& tok) {
  data::Tokenizer& t = const_cast<data::Tokenizer&>(tok);  // (encode caches; the tokenizer stays the same)
  const std::vector<uint32_t> bos = t.encode("", /*add_special=*/true);
  if (!bos.empty()) return bos[0];
  if (tok.kind() == "gpt2") return data::Gpt2Tokenizer::kEot;
  if (tok.hf()) {
    const data::ChatTokenizer ct = data::chat_tokenizer(tok, /*need_template=*/false);
    if (ct.eos_id >= 0) return ct.eos_id;
  }
  return -1;
}

LlRequest encode_request(data::Tokenizer& tok, std::string context, std::string continuation, bool add_bos,
                         int64_t prefix, const std::string& where) {
  size_t keep = context.size();
  while (keep > 0 && is_space(context[keep - 1])) --keep;
  continuation = context.substr(keep) + continuation;
  context.resize(keep);
  LlRequest r;
  if (context.empty()) {
    std::vector<int64_t> c = encode(tok, continuation, add_bos);
    CASTOR_CHECK(prefix >= 0, where,
                 ": an empty context, and the tokenizer has no BOS or end-of-text token to start "
                 "from");
    if (!c.empty() && c[0] == prefix) {
      r.context = {prefix};
      r.continuation.assign(c.begin() + 1, c.end());
    } else {
      r.context = {prefix};
      r.continuation = std::move(c);
    }
  } else {
    const std::vector<int64_t> whole = encode(tok, context + continuation, add_bos);
    r.context = encode(tok, context, add_bos);
    if (whole.size() > r.context.size()) r.continuation.assign(whole.begin() + r.context.size(), whole.end());
  }
  CASTOR_CHECK(!r.continuation.empty(), where, ": the continuation ", printable(continuation),
               " encodes to no token after the context");
  return r;
}

models::KVCache& LlScorer::cache() {
  if (!cache_) cache_.emplace(model_);
  return *cache_;
}

std::vector<double> LlScorer::score(const std::vector<LlRequest>& requests) {
  const int64_t T = model_.block_size(), V = model_.vocab_size();
  std::vector<double> out(requests.size(), 0.0);
  std::vector<bool> done(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (done[i]) continue;
    const std::vector<int64_t>& ctx = requests[i].context;
    std::vector<size_t> group;
    int64_t longest = 0;
    for (size_t j = i; j < requests.size(); ++j) {
      if (done[j] || requests[j].context != ctx) continue;
      const int64_t n = static_cast<int64_t>(requests[j].continuation.size());
      CASTOR_CHECK(n >= 1 && n <= T, "a continuation of ", n, " tokens: more than the model's context of ", T);
      group.push_back(j), done[j] = true, longest = std::max(longest, n);
    }
    const int64_t c = static_cast<int64_t>(ctx.size());
    if (c + longest - 1 > T) {  // lm-eval's left truncation, each request alone
      for (size_t j : group) {
        const std::vector<int64_t>& cont = requests[j].continuation;
        std::vector<int64_t> seq = ctx;
        seq.insert(seq.end(), cont.begin(), cont.end());
        if (static_cast<int64_t>(seq.size()) > T + 1) {
          seq.erase(seq.begin(), seq.end() - (T + 1));
          ++truncated_;
        }
        const std::vector<double> inp(seq.begin(), seq.end() - 1);
        models::KVCache& kv = cache();
        kv.clear();
        const Tensor logits = real_logits(models::forward_cached(model_, ids_tensor(inp, 1), kv), V);  // (1, n, V)
        const float* p = logits.data<float>();
        const int64_t n = static_cast<int64_t>(inp.size()), len = static_cast<int64_t>(cont.size());
        for (int64_t t = 0; t < len; ++t) out[j] += log_prob(p + (n - len + t) * V, V, cont[t]);
        tokens_ += n;
      }
      continue;
    }
    // The context once and the continuations but their last tokens as runs after it, in as few forwards as the
    // cache holds: each continuation attends the context's keys and values and its own tokens, none copied. The
    // context's last position predicts every continuation's first token, a continuation's position t its token t + 1.
    models::KVCache& kv = cache();
    kv.clear();
    std::vector<double> ids(ctx.begin(), ctx.end());
    std::vector<models::TokenRun> runs = {{c, 0}};
    std::vector<size_t> members;  // the group's requests whose continuations run in this forward
    for (size_t next = 0, forward = 0; forward == 0 || next < group.size(); ++forward) {
      const int64_t held = forward == 0 ? 0 : c;  // the context: in this forward, or in the cache from the first
      while (next < group.size()) {
        const std::vector<int64_t>& cont = requests[group[next]].continuation;
        const int64_t len = static_cast<int64_t>(cont.size()) - 1;
        if (held + static_cast<int64_t>(ids.size()) + len > kv.capacity()) break;
        if (len > 0) {
          ids.insert(ids.end(), cont.begin(), cont.end() - 1);
          runs.push_back({len, c});
        }
        members.push_back(group[next++]);
      }
      const int64_t from = forward == 0 ? c - 1 : 0;
      const Tensor logits = real_logits(models::forward_runs(model_, ids_tensor(ids, 1), kv, runs, from, forward == 0),
                                        V);  // (1, ids - from, V)
      const float* p = logits.data<float>();
      if (forward == 0)
        for (size_t j : group) out[j] = log_prob(p, V, requests[j].continuation[0]);
      int64_t row = forward == 0 ? 1 : 0;
      for (size_t j : members) {
        const std::vector<int64_t>& cont = requests[j].continuation;
        for (size_t t = 1; t < cont.size(); ++t) out[j] += log_prob(p + (row++) * V, V, cont[t]);
      }
      tokens_ += static_cast<int64_t>(ids.size());
      ids.clear(), runs.clear(), members.clear();
    }
  }
  return out;
}

std::vector<LlRequest> mc_requests(data::Tokenizer& tok, const data::McDoc& doc, bool add_bos, int64_t prefix,
                                   const std::string& path) {
  std::vector<LlRequest> out;
  for (int64_t i = 0; i < doc.n_choices(); ++i)
    out.push_back(encode_request(tok, doc.context(i), doc.continuation(i), add_bos, prefix,
                                 detail::cat(path, ": line ", doc.line, ": choice ", i)));
  return out;
}

McCorrect mc_correct(const data::McDoc& doc, const McScore& s) {
  std::vector<double> by_chars, by_tokens;
  for (int64_t i = 0; i < doc.n_choices(); ++i) {
    by_chars.push_back(s.loglik[i] / static_cast<double>(data::code_points(doc.choices[i])));
    by_tokens.push_back(s.loglik[i] / static_cast<double>(s.tokens[i]));
  }
  return {argmax(s.loglik) == doc.gold, argmax(by_chars) == doc.gold, argmax(by_tokens) == doc.gold};
}

Json mc_results(const data::McTask& task, const std::vector<McScore>& scores) {
  CASTOR_ASSERT(scores.size() == task.docs.size(), "scores of ", scores.size(), " rows for ", task.docs.size());
  std::vector<double> acc, acc_norm, acc_tokens;
  std::map<std::string, std::vector<double>> subjects;
  for (size_t i = 0; i < scores.size(); ++i) {
    const McCorrect c = mc_correct(task.docs[i], scores[i]);
    acc.push_back(c.acc), acc_norm.push_back(c.acc_norm), acc_tokens.push_back(c.acc_norm_tokens);
    if (!task.docs[i].subject.empty()) subjects[task.docs[i].subject].push_back(c.acc);
  }
  Json r = Json::Object{
      {"task", data::mc_format_name(task.format)}, {"file", task.path}, {"samples", static_cast<int64_t>(acc.size())}};
  r["acc,none"] = mean(acc), r["acc_stderr,none"] = stderr_of(acc);
  r["acc_norm,none"] = mean(acc_norm), r["acc_norm_stderr,none"] = stderr_of(acc_norm);
  r["acc_norm_tokens,none"] = mean(acc_tokens), r["acc_norm_tokens_stderr,none"] = stderr_of(acc_tokens);
  if (!subjects.empty()) {
    // lm-eval's mmlu group: the mean over all rows (weight_by_size) with the pooled standard error; and the macro
    // average, the mean of the subjects' means.
    Json per = Json::Object{};
    double pooled = 0, macro = 0;
    for (const auto& [name, v] : subjects) {
      const Json se = stderr_of(v);
      const double n = static_cast<double>(v.size()), s = se.is_null() ? 0.0 : se.as_double();
      pooled += (n - 1) * s * s * n;
      macro += mean(v);
      per[name] = Json::Object{{"acc,none", mean(v)}, {"acc_stderr,none", se}, {"samples", static_cast<int64_t>(n)}};
    }
    const double N = static_cast<double>(acc.size()), S = static_cast<double>(subjects.size());
    r["acc_stderr,none"] = N > S ? Json(std::sqrt(pooled / (N - S) / N)) : Json(nullptr);
    r["acc_macro,none"] = macro / S;
    r["subjects"] = std::move(per);
  }
  return r;
}

std::string mc_table(const Json& results) {
  std::string out;
  auto line = [&](const std::string& task, const std::string& metric, const Json& value, const Json& se,
                  int64_t samples) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%-40s %-16s %7.4f %2s %6s %6lld\n", task.c_str(), metric.c_str(),
                  value.as_double(), se.is_null() ? "" : "±",
                  se.is_null() ? "" : detail::cat(std::round(se.as_double() * 1e4) / 1e4).c_str(),
                  static_cast<long long>(samples));
    out += buf;
  };
  char head[128];
  std::snprintf(head, sizeof(head), "%-40s %-16s %7s %8s %7s\n", "task", "metric", "value", "stderr", "rows");
  out += head;
  const std::string task = results.at("task").as_string();
  const int64_t n = results.at("samples").as_int();
  for (const char* m : {"acc", "acc_norm", "acc_norm_tokens"})
    line(task, m, results.at(std::string(m) + ",none"), results.at(std::string(m) + "_stderr,none"), n);
  if (const Json* macro = results.find("acc_macro,none")) line(task, "acc_macro", *macro, nullptr, n);
  if (const Json* subjects = results.find("subjects"))
    for (const auto& [name, s] : subjects->as_object())
      line(" - " + name, "acc", s.at("acc,none"), s.at("acc_stderr,none"), s.at("samples").as_int());
  return out;
}

std::vector<McScore> score_mc_task(models::LanguageModel& model, data::Tokenizer& tok, const data::McTask& task,
                                   bool add_bos, LlScorer& scorer, const std::function<void(int64_t)>& progress) {
  const int64_t prefix = prefix_token(tok), T = model.block_size();
  std::vector<McScore> scores;
  for (const data::McDoc& doc : task.docs) {
    const std::vector<LlRequest> requests = mc_requests(tok, doc, add_bos, prefix, task.path);
    McScore s;
    for (size_t i = 0; i < requests.size(); ++i) {
      const int64_t n = static_cast<int64_t>(requests[i].continuation.size());
      CASTOR_CHECK(n <= T, task.path, ": line ", doc.line, ": choice ", i, " is ", n,
                   " tokens, longer than the model's context of ", T, " (lm-eval refuses it too)");
      s.tokens.push_back(n);
    }
    s.loglik = scorer.score(requests);
    scores.push_back(std::move(s));
    if (progress) progress(static_cast<int64_t>(scores.size()));
  }
  return scores;
}

std::optional<data::ChatFormat> chat_task_format(const std::string& path, const std::string& task_format) {
  if (!task_format.empty()) {
    const std::vector<std::string> mc = data::mc_format_names();
    if (std::find(mc.begin(), mc.end(), task_format) != mc.end()) return std::nullopt;
    return data::parse_chat_format(task_format);
  }
  std::optional<data::ChatFormat> format;
  struct Stop {};
  try {
    data::for_each_jsonl_row(path, [&](const Json& row, int64_t, const std::string&) {
      const auto has = [&](const char* key) { return row.is_object() && row.find(key) != nullptr; };
      if (!data::infer_mc_format(row)) {
        if (has("messages") || has("conversations")) format = data::ChatFormat::Chat;
        if (has("prompt") && has("completion")) format = data::ChatFormat::PromptCompletion;
        if (has("instruction") && has("output")) format = data::ChatFormat::Alpaca;
      }
      throw Stop{};
    });
  } catch (const Stop&) {
  } catch (const Error& e) {
    throw Error(detail::cat("--eval-task: ", e.what()));
  }
  return format;
}

std::vector<std::string> task_score_keys(const TrainConfig& c) {
  if (chat_task_format(c.eval_task, c.task_format)) return {"task_loss", "task_perplexity"};
  return {"task_acc", "task_acc_norm", "task_acc_norm_tokens"};
}

TrainTaskScorer::TrainTaskScorer(const TrainConfig& c) {
  const std::optional<data::ChatFormat> chat = chat_task_format(c.eval_task, c.task_format);
  try {
    const std::string dir = data_dir(c);
    CASTOR_CHECK(data::Tokenizer::is_loadable(dir), dir, " holds no tokenizer to encode the task's rows with");
    tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(dir));
    if (chat) {
      const data::ChatTokenizer ct = data::chat_tokenizer(*tok_, *chat == data::ChatFormat::Chat);
      const data::ChatTemplate tmpl(ct.chat_template, ct.template_what);
      data::for_each_jsonl_row(c.eval_task, [&](const Json& row, int64_t, const std::string& where) {
        chat_.push_back(data::tokenize_row(row, *chat, tmpl, ct, /*train_on_prompt=*/false, where));
      });
      CASTOR_CHECK(!chat_.empty(), c.eval_task, ": no rows (an empty task file)");
      pad_id_ = ct.pad_id;
      return;
    }
    data::McTaskOptions opt;
    if (!c.task_format.empty()) opt.format = data::parse_mc_format(c.task_format);
    task_ = data::read_mc_task(c.eval_task, opt);
  } catch (const Error& e) {
    throw Error(detail::cat("--eval-task: ", e.what()));
  }
}

std::vector<std::pair<std::string, double>> TrainTaskScorer::score_chat(models::LanguageModel& model) {
  const int64_t T = model.block_size(), V = model.vocab_size();
  const data::Rows rows = data::make_rows(chat_, T + 1, /*drop_long=*/false, /*pack=*/false, pad_id_);
  constexpr int64_t kBatch = 8;
  double nll = 0;
  int64_t targets = 0;
  for (int64_t r0 = 0; r0 < rows.rows; r0 += kBatch) {
    const int64_t b = std::min(kBatch, rows.rows - r0);
    std::vector<double> x;
    for (int64_t r = r0; r < r0 + b; ++r)
      x.insert(x.end(), rows.ids.begin() + r * (T + 1), rows.ids.begin() + r * (T + 1) + T);
    const Tensor logits = real_logits(model(ids_tensor(x, b)), V);  // (b, T, V)
    const float* l = logits.data<float>();
    for (int64_t r = 0; r < b; ++r)
      for (int64_t t = 1; t <= T; ++t) {
        const int64_t at = (r0 + r) * (T + 1) + t;
        if (!rows.mask[at]) continue;
        nll -= log_prob(l + (r * T + t - 1) * V, V, rows.ids[at]);
        ++targets;
      }
  }
  CASTOR_CHECK(targets > 0, "--eval-task: no answer token fits the block size of ", T);
  const double loss = nll / static_cast<double>(targets);
  return {{"task_loss", loss}, {"task_perplexity", std::exp(loss)}};
}

std::vector<std::pair<std::string, double>> TrainTaskScorer::score(models::LanguageModel& model, const amp::Amp& amp) {
  model.eval();
  std::vector<McScore> scores;
  std::vector<std::pair<std::string, double>> chat;
  {
    auto fw = amp.forward();
    if (!chat_.empty()) {
      const NoGradGuard no_grad;
      chat = score_chat(model);
    } else {
      LlScorer scorer(model);
      scores = score_mc_task(model, *tok_, task_, /*add_bos=*/false, scorer, nullptr);
    }
  }
  model.train();
  if (!chat_.empty()) return chat;
  const Json r = mc_results(task_, scores);
  return {{"task_acc", r.at("acc,none").as_double()},
          {"task_acc_norm", r.at("acc_norm,none").as_double()},
          {"task_acc_norm_tokens", r.at("acc_norm_tokens,none").as_double()}};
}

Perplexity perplexity(models::LanguageModel& model, std::vector<int64_t> tokens, int64_t ctx, int64_t bos) {
  const int64_t T = model.block_size(), V = model.vocab_size(), n = static_cast<int64_t>(tokens.size());
  CASTOR_CHECK(ctx >= 2 && ctx <= T, "--ctx ", ctx, ": must be in [2, ", T, "] (the model's context)");
  CASTOR_CHECK(n >= 2 * ctx, "--text: ", n, " tokens; llama-perplexity's chunks need at least 2 x --ctx = ", 2 * ctx);
  Perplexity p;
  p.chunks = n / ctx;
  const int64_t first = ctx / 2;
  models::KVCache cache(model);
  double nll = 0;
  for (int64_t c = 0; c < p.chunks; ++c) {
    std::vector<double> seq(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (bos >= 0) seq[0] = static_cast<double>(bos);
    cache.clear();
    const Tensor logits = real_logits(models::forward_cached(model, ids_tensor(seq, 1), cache), V);  // (1, ctx, V)
    const float* row = logits.data<float>();
    for (int64_t i = first; i < ctx - 1; ++i) nll -= log_prob(row + i * V, V, static_cast<int64_t>(seq[i + 1]));
    p.tokens += ctx - 1 - first;
  }
  p.nll = nll / static_cast<double>(p.tokens);
  p.perplexity = std::exp(p.nll);
  return p;
}

}  // namespace castor::train
