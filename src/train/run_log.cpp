// The run's progress output (stderr: a width-fitted line on a terminal, plain lines otherwise) and metrics records.
#include "train/run_log.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string_view>

#include "castor/allocator.h"
#include "train/progress.h"

namespace castor::train {

RunLog::RunLog(const TrainConfig& c, const char* unit, int64_t total_steps, int64_t epochs, bool append,
               FlopRate flops)
    : metrics_(c.out, append, std::string_view(unit) == "tok"),
      log_every_(c.log_every),
      total_steps_(total_steps),
      epochs_(epochs),
      tty_(isatty(STDERR_FILENO) != 0),
      width_(terminal_width(STDERR_FILENO) - 1),
      unit_(unit),
      language_model_(std::string_view(unit) == "tok"),
      flops_(flops) {}

void RunLog::step(const StepInfo& s) {
  window_sum_ += s.loss;
  ++window_count_;
  const double ips = s.train_seconds > 0 ? s.images / s.train_seconds : 0;
  const bool window_end = s.step % log_every_ == 0 || s.step == total_steps_;
  if (window_end || s.skipped) {
    Json::Object m{{"step", s.step}, {"epoch", s.epoch}, {"loss", s.loss}, {"lr", s.lr}, {"loss_scale", s.loss_scale},
                   {"skipped", s.skipped}, {rate_key(), ips}, {"peak_memory_bytes", memory_stats().peak_bytes}};
    if (window_end) m["loss_avg"] = window_sum_ / static_cast<double>(window_count_);
    metrics_.write(m);
  }
  const double window_mean = window_sum_ / static_cast<double>(window_count_);
  if (tty_) {
    const ProgressState p{s.epoch, epochs_, s.step, total_steps_, window_mean, s.lr, s.loss_scale, ips,
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
                          s.loss_scaling, unit_, mfu(ips)};
    std::fprintf(stderr, "\r%s\x1b[K", progress_line(p, width_).c_str());
    std::fflush(stderr);
    progress_drawn_ = true;
  } else if (window_end) {
    char scale[48] = "";
    if (s.loss_scaling) std::snprintf(scale, sizeof(scale), "  scale %g", s.loss_scale);
    char rate[48] = "";
    if (mfu(ips) > 0) std::snprintf(rate, sizeof(rate), "  MFU %.1f%%", 100 * mfu(ips));
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g%s  %.0f %s/s%s\n", static_cast<long long>(s.step),
                 static_cast<long long>(total_steps_), window_mean, s.lr, scale, ips, unit_, rate);
  }
  if (window_end) {
    window_sum_ = 0;
    window_count_ = 0;
  }
}

Json::Object RunLog::evaluation_keys(double loss, double accuracy) const {
  if (language_model_) return {{"val_loss", loss}, {"val_perplexity", std::exp(loss)}};
  return {{"test_loss", loss}, {"test_accuracy", accuracy}};
}

void RunLog::evaluation(int64_t step, int64_t epoch, double loss, double accuracy,
                        const std::vector<std::string>& fields) {
  Json::Object record = evaluation_keys(loss, accuracy);
  record["step"] = step, record["epoch"] = epoch;
  metrics_.write(record);
  finish_progress_line();
  std::string line = detail::cat("step ", step);
  for (const std::string& f : fields) line += "  " + f;
  std::fprintf(stderr, "%s\n", line.c_str());
}

void RunLog::epoch(const Json::Object& record, const std::vector<std::string>& fields) {
  metrics_.write(record);
  finish_progress_line();
  std::fprintf(stderr, "%s\n", fit_fields(fields, tty_ ? width_ : INT32_MAX).c_str());
}

void RunLog::finish_progress_line() {
  if (progress_drawn_) std::fputc('\n', stderr);
  progress_drawn_ = false;
}

}  // namespace castor::train
