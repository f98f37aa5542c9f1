// A run's training throughput: examples (images or tokens, the whole job's) over the seconds spent in training steps,
// for the whole run and at the steady rate after this process's first kWarmupSteps steps (primitive creation,
// first-touch memory), which is what a long run sees.
#pragma once
#include <cstdint>
#include <utility>

namespace castor::train {

class Throughput {
 public:
  static constexpr int64_t kWarmupSteps = 3;

  void add_examples(double n) { examples_ += n; }
  void add_seconds(double s) { seconds_ += s; }
  // After an optimizer step (its examples and seconds added).
  void step_done() {
    if (++steps_ == kWarmupSteps) warm_ = {examples_, seconds_};
  }
  double whole_rate() const { return seconds_ > 0 ? examples_ / seconds_ : 0.0; }
  // The rate since the warm-up steps (the whole run's until there are steps after them).
  double steady_rate() const {
    const double steady_seconds = seconds_ - warm_.second;
    return steps_ > kWarmupSteps && steady_seconds > 0 ? (examples_ - warm_.first) / steady_seconds : whole_rate();
  }

 private:
  double examples_ = 0, seconds_ = 0;
  int64_t steps_ = 0;                     // steps taken by this process (a resumed run's since it resumed)
  std::pair<double, double> warm_{0, 0};  // (examples, seconds) after kWarmupSteps steps
};

}  // namespace castor::train
