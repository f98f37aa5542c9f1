// The training loop's micro-batches, fetched ahead for a masked task's target count (train/step_batches.h).
#include "train/step_batches.h"

#include <algorithm>

#include "castor/dist.h"
#include "castor/ops.h"

namespace castor::train {

std::optional<Batch> StepBatches::next(bool first) {
  std::optional<Batch> b;
  if (pending_.empty()) {
    b = task_.next();
  } else {
    b = std::move(pending_.front());
    pending_.erase(pending_.begin());
  }
  if (!b || !first || !task_.masked()) return b;
  const int64_t k = std::min(grad_accum_, task_.batches_per_epoch() - b->index);
  double targets = b->targets;
  while (static_cast<int64_t>(pending_.size()) + 1 < k) {
    std::optional<Batch> more = task_.next();
    if (!more) break;
    targets += more->targets;
    pending_.push_back(std::move(*more));
  }
  if (world_ > 1) {
    Tensor t = tensor({targets}, {1}, DType::Float64);
    dist::all_reduce(t);
    targets = t.to_vector<double>()[0];
  }
  step_targets_ = targets;
  return b;
}

}  // namespace castor::train
