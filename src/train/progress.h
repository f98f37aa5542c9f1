// The terminal progress line of `castor train`: fits the terminal's width, rewritten in place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace castor::train {

struct ProgressState {
  int64_t epoch = 1, epochs = 1;  // epochs are numbered from 1 in everything a run shows and records
  int64_t step = 0, total_steps = 0;
  double loss = 0;  // the mean over the current logging window, as metrics.jsonl's loss_avg
  double lr = 0, loss_scale = 1, examples_per_sec = 0;  // examples: images or tokens (unit)
  double elapsed_seconds = 0;
  bool loss_scaling = true;  // false (bf16, O0): no scale field
  const char* unit = "img";  // of the throughput: images or tokens ("tok")
  double mfu = 0;            // > 0: model FLOP utilization against the measured GEMM peak, shown as a percentage
  int64_t start_step = 0;    // the step this process started from (a resumed run's): elapsed_seconds covers the rest
};

// "h:mm:ss".
std::string clock_text(double seconds);
// The time the steps left will take at the pace of those this process has done (0 before its first).
double remaining_seconds(const ProgressState& s);

// `fields` (most important first) joined by two spaces, as many as fit in `width` columns (the rest left out).
std::string fit_fields(const std::vector<std::string>& fields, int width);

// One progress line of at most `width` characters (fields are dropped from the right, then the bar shrinks,
// so it never wraps): "[####    ] epoch 1/3 step 120/938 loss 0.4521 lr 1e-03 scale 65536 1234 img/s 0:01:23<0:04:10".
std::string progress_line(const ProgressState& s, int width);

// The width of the terminal on file descriptor `fd` ($COLUMNS, else 80, when it is not a terminal).
int terminal_width(int fd);

}  // namespace castor::train
