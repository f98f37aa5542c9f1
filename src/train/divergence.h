// Stops a run whose training diverged or can no longer step, with a one-line error saying what to try.
#pragma once
#include <cstdint>

namespace castor::train {

class DivergenceGuard {
 public:
  // `dynamic_scale`: the loss scale grows and backs off (GradScaler's dynamic scaling), so a non-finite loss is a
  // skipped step, not a divergence.
  explicit DivergenceGuard(bool dynamic_scale) : dynamic_scale_(dynamic_scale) {}
  // After step `step` (its loss; whether it stepped; the loss scale now): castor::Error "diverged at step N" on a
  // non-finite loss without dynamic loss scaling (O0, O3 bf16), or when dynamic scaling skips step after step or
  // drives the scale below a floor; and when a static loss scale overflows the gradients kMaxSkippedStatic steps in
  // a row (nothing would be trained).
  void check(int64_t step, double loss, bool stepped, double scale);

 private:
  static constexpr int64_t kMaxSkippedInARow = 64;
  static constexpr int64_t kMaxSkippedStatic = 20;
  static constexpr double kMinLossScale = 0x1p-24;
  const bool dynamic_scale_;
  int64_t skipped_in_a_row_ = 0;
};

}  // namespace castor::train
