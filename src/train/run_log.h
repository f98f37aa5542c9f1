// What a training run tells its user and records: the progress line or plain lines on stderr, and the metrics log.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "castor/train_config.h"
#include "castor/trainer.h"
#include "train/metrics.h"

namespace castor::train {

class Task;
struct Evaluation;

// One optimizer step as the log sees it.
struct StepInfo {
  int64_t step = 0, epoch = 0;
  double loss = 0, lr = 0, loss_scale = 1;
  bool skipped = false;
  double examples_per_sec = 0;  // the job's images or tokens a second, at the steady rate (train/throughput.h)
  bool loss_scaling = true;     // false: the scale is not shown (no loss scaling: bf16, O0)
};

// The end of an epoch as the log sees it.
struct EpochInfo {
  int64_t epoch = 0, step = 0;  // the epoch numbered from 1
  double train_loss = 0, examples_per_sec = 0, loss_scale = 1;
  int64_t skipped_steps = 0;
  bool loss_scaling = true;  // false: no scale fields (no loss scaling: bf16, O0)
};

// What a throughput in examples/s (of the whole job) means for MFU: model FLOPs per example (training: forward and
// backward) and one rank's GEMM peak in FLOP/s, measured at its thread count in gemm_dtype; MFU is shown when both
// are positive. A peak not cached for this machine yet is measured after training, so the progress lines show none
// and the summary has it.
struct FlopRate {
  double flops_per_example = 0, rank_peak = 0;
  DType gemm_dtype = DType::Float32;
  int ranks = 1;
};

// Model FLOP utilization: the job's examples/s (all ranks together) times the FLOPs per example, over the GEMM peak
// of all the ranks' cores together (rank_peak x ranks); 0 while either term is unknown, and 0 above 1 (a peak
// measured while other processes held the cores).
double model_flops_utilization(double job_examples_per_sec, const FlopRate& f);

class RunLog {
 public:
  // `append`: a resumed run adds to its metrics files; `task` names the throughput and the evaluation's figures;
  // `first_step`: the step this process starts from (a resumed run's), which the time left is paced from.
  RunLog(const TrainConfig& c, const Task& task, int64_t total_steps, int64_t epochs, bool append, FlopRate flops = {},
         int64_t first_step = 0);

  // Logs a metrics line every log_every steps (with the window's mean loss), at the last step and at every
  // skipped step; redraws the progress line (a terminal) or prints a plain line every log_every steps.
  void step(const StepInfo& s);
  // A mid-epoch evaluation: its record (the task's evaluation_keys) and its line, "step N" and its eval_fields.
  void evaluation(int64_t step, int64_t epoch, const Evaluation& ev);
  double mfu(double examples_per_sec) const { return model_flops_utilization(examples_per_sec, flops_); }
  // Measures (and caches) the peak after training when the run started without one, or when the run went faster
  // than the cached peak (measured while the machine was busy): utilisation above 1 is never reported.
  void measure_peak_if_unknown(double examples_per_sec) {
    if (flops_.flops_per_example > 0 &&
        examples_per_sec * flops_.flops_per_example >= flops_.rank_peak * static_cast<double>(flops_.ranks))
      flops_.rank_peak = measure_gemm_peak(flops_.gemm_dtype);
  }
  // The end-of-epoch record (with the evaluation's keys), and its line: on a terminal as many of its fields (most
  // important first) as fit its width.
  void epoch(const EpochInfo& e, const Evaluation& ev);
  // Ends a progress line in place (before other output).
  void finish_progress_line();
  int64_t lost_lines() const { return metrics_.lost_lines(); }

 private:
  MetricsLog metrics_;
  int64_t log_every_, total_steps_, epochs_, first_step_;
  bool tty_;
  int width_;
  bool progress_drawn_ = false;
  const Task& task_;
  FlopRate flops_;
  double window_sum_ = 0;
  int64_t window_count_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace castor::train
