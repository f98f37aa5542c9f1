// The run's progress output (stderr: a width-fitted line on a terminal, plain lines otherwise) and metrics records.
#include "train/run_log.h"

#include <unistd.h>

#include <cstdio>

#include "castor/allocator.h"
#include "train/lm_scoring.h"
#include "train/progress.h"
#include "train/task.h"

namespace castor::train {

namespace {
// The record of an evaluation's figures.
// The record of an evaluation's figures (--eval-task's after the task's own).
Json::Object evaluation_record(const Task& task, const Evaluation& ev) {
  Json::Object record;
  for (const auto& [key, value] : task.evaluation_keys(ev)) record[key] = value;
  for (const auto& [key, value] : ev.task_scores) record[key] = value;
  return record;
}

std::vector<std::string> metrics_columns(const TrainConfig& c, const Task& task) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : task.evaluation_keys(Evaluation{})) keys.push_back(key);
  if (!c.eval_task.empty())
    for (const std::string& key : task_score_keys(c)) keys.push_back(key);
  return MetricsLog::columns(task.rate_key(), keys);
}

// An evaluation's line: the task's fields, then --eval-task's ("task_acc_norm 0.3125").
std::vector<std::string> evaluation_fields(const Task& task, const Evaluation& ev) {
  std::vector<std::string> fields = task.eval_fields(ev);
  for (const auto& [key, value] : ev.task_scores) fields.push_back(detail::cat(key, " ", value));
  return fields;
}
}  // namespace

double model_flops_utilization(double job_examples_per_sec, const FlopRate& f) {
  const double peak = f.rank_peak * f.ranks;
  const double u = peak > 0 ? job_examples_per_sec * f.flops_per_example / peak : 0;
  return u <= 1 ? u : 0;  // (above the peak: the peak was measured on a busy machine; not reported)
}

RunLog::RunLog(const TrainConfig& c, const Task& task, int64_t total_steps, int64_t epochs, bool append, FlopRate flops,
               int64_t first_step)
    : metrics_(c.out, append, metrics_columns(c, task)),
      log_every_(c.log_every),
      total_steps_(total_steps),
      epochs_(epochs),
      first_step_(first_step),
      tty_(isatty(STDERR_FILENO) != 0),
      width_(terminal_width(STDERR_FILENO) - 1),
      task_(task),
      flops_(flops) {}

void RunLog::step(const StepInfo& s) {
  window_sum_ += s.loss;
  ++window_count_;
  const double ips = s.examples_per_sec;
  const bool window_end = s.step % log_every_ == 0 || s.step == total_steps_;
  if (window_end || s.skipped) {
    Json::Object m{{"step", s.step},
                   {"epoch", s.epoch},
                   {"loss", s.loss},
                   {"lr", s.lr},
                   {"loss_scale", s.loss_scale},
                   {"skipped", s.skipped},
                   {task_.rate_key(), ips},
                   {"peak_memory_bytes", memory_stats().peak_bytes}};
    if (window_end) m["loss_avg"] = window_sum_ / static_cast<double>(window_count_);
    metrics_.write(m);
  }
  const double window_mean = window_sum_ / static_cast<double>(window_count_);
  const ProgressState p{
      s.epoch,        epochs_,      s.step,
      total_steps_,   window_mean,  s.lr,
      s.loss_scale,   ips,          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
      s.loss_scaling, task_.unit(), mfu(ips),
      first_step_};
  if (tty_) {
    std::fprintf(stderr, "\r%s\x1b[K", progress_line(p, width_).c_str());
    std::fflush(stderr);
    progress_drawn_ = true;
  } else if (window_end) {
    char scale[48] = "";
    if (s.loss_scaling) std::snprintf(scale, sizeof(scale), "  scale %g", s.loss_scale);
    char rate[48] = "";
    if (mfu(ips) > 0) std::snprintf(rate, sizeof(rate), "  MFU %.1f%%", 100 * mfu(ips));
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g%s  %.0f %s/s%s  elapsed %s  eta %s\n",
                 static_cast<long long>(s.step), static_cast<long long>(total_steps_), window_mean, s.lr, scale, ips,
                 task_.unit(), rate, clock_text(p.elapsed_seconds).c_str(), clock_text(remaining_seconds(p)).c_str());
  }
  if (window_end) {
    window_sum_ = 0;
    window_count_ = 0;
  }
}

void RunLog::evaluation(int64_t step, int64_t epoch, const Evaluation& ev) {
  Json::Object record = evaluation_record(task_, ev);
  record["step"] = step, record["epoch"] = epoch;
  metrics_.write(record);
  finish_progress_line();
  std::string line = detail::cat("step ", step);
  for (const std::string& f : evaluation_fields(task_, ev)) line += "  " + f;
  std::fprintf(stderr, "%s\n", line.c_str());
}

void RunLog::epoch(const EpochInfo& e, const Evaluation& ev) {
  const int64_t peak = memory_stats().peak_bytes;
  char buf[64];
  std::vector<std::string> fields;  // most important first: the terminal shows those that fit
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof(buf), fmt, args...);
    fields.push_back(buf);
  };
  add("epoch %lld/%lld", static_cast<long long>(e.epoch), static_cast<long long>(epochs_));
  for (const std::string& f : task_.epoch_fields(ev, e.train_loss)) fields.push_back(f);
  for (const auto& [key, value] : ev.task_scores) fields.push_back(detail::cat(key, " ", value));
  add("%.0f %s/s", e.examples_per_sec, task_.unit());
  if (mfu(e.examples_per_sec) > 0) add("MFU %.1f%%", 100 * mfu(e.examples_per_sec));
  if (e.loss_scaling) {
    add("scale %g", e.loss_scale);
    add("skipped %lld", static_cast<long long>(e.skipped_steps));
  }
  add("peak mem %.1f MiB", static_cast<double>(peak) / 1048576.0);
  Json::Object record{{"epoch", e.epoch},           {"step", e.step},
                      {"train_loss", e.train_loss}, {task_.rate_key(), e.examples_per_sec},
                      {"loss_scale", e.loss_scale}, {"skipped_steps", e.skipped_steps},
                      {"peak_memory_bytes", peak}};
  for (auto& [key, value] : evaluation_record(task_, ev)) record[key] = value;
  metrics_.write(record);
  finish_progress_line();
  std::fprintf(stderr, "%s\n", fit_fields(fields, tty_ ? width_ : INT32_MAX).c_str());
}

void RunLog::finish_progress_line() {
  if (progress_drawn_) std::fputc('\n', stderr);
  progress_drawn_ = false;
}

}  // namespace castor::train
