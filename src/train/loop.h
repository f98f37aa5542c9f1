// The training loop: micro-batches and optimizer steps, metrics, evaluations, checkpoints, divergence and interrupts.
#pragma once
#include <cstdint>

#include "castor/json.h"
#include "castor/train_config.h"
#include "train/run_dir.h"
#include "train/task.h"

namespace castor::train {

// Trains `run` on `task` from `state` to `total_steps` (or an interrupt: then it checkpoints the finished step and
// returns the summary with "interrupted_by_signal"); writes metrics, checkpoints, report.html and summary.json under
// c.out (rank 0) and returns the summary.
Json train_loop(const TrainConfig& c, Task& task, Run& run, const Json& config, TrainState state, int64_t total_steps,
                int64_t epochs, FlopRate flops);

// Whether this process says what an interrupt does (rank 0 only: every rank of a job gets the signal).
void announce_interrupts(bool say);

}  // namespace castor::train
