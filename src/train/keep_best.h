// --keep-best METRIC and --early-stop N: which evaluation is the best so far, and when evaluations without a better
// one end the run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/task.h"

namespace castor::train {

class KeepBest {
 public:
  // Checks --keep-best against `metrics` (the run's evaluation keys) and --early-stop's need of it; a resumed run
  // goes on from the best RUN/best records for the same metric. castor::Error naming the flag.
  KeepBest(const std::string& run_dir, const std::string& metric, int64_t early_stop,
           const std::vector<std::string>& metrics);

  enum class Verdict { None, Better, Stop };
  // After an evaluation: Better when its metric beats the best so far (lower for a loss or perplexity, else higher),
  // Stop when it is the early_stop-th evaluation in a row without; None otherwise (and without --keep-best).
  Verdict observe(const Task& task, const Evaluation& ev);

  double best() const { return best_.value_or(0.0); }
  int64_t stale() const { return stale_; }

 private:
  const std::string metric_;  // empty: no --keep-best
  const int64_t early_stop_;
  std::optional<double> best_;
  int64_t stale_ = 0;  // evaluations since the best was last bettered
};

}  // namespace castor::train
