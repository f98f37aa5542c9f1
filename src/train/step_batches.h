// The micro-batches of the training loop's steps, from its task: a masked task's step divides its summed loss by the
// targets of all its micro-batches on all ranks, which must be known before its first backward.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "train/task.h"

namespace castor::train {

class StepBatches {
 public:
  StepBatches(Task& task, int64_t grad_accum, int world) : task_(task), grad_accum_(grad_accum), world_(world) {}
  // The task's next batch (none at the epoch's end). At a step's start (`first`) of a masked task it fetches the step's
  // other micro-batches ahead and all-reduces their targets (step_targets()).
  std::optional<Batch> next(bool first);
  // The targets of the current step's micro-batches, all ranks (masked tasks).
  double step_targets() const { return step_targets_; }

 private:
  Task& task_;
  const int64_t grad_accum_;
  const int world_;
  std::vector<Batch> pending_;  // the step's micro-batches fetched ahead
  double step_targets_ = 0;
};

}  // namespace castor::train
