// The divergence checks of the training loop (train/divergence.h).
#include "train/divergence.h"

#include <cmath>

#include "castor/check.h"

namespace castor::train {

void DivergenceGuard::check(int64_t step, double loss, bool stepped, double scale) {
  skipped_in_a_row_ = stepped ? 0 : skipped_in_a_row_ + 1;
  if (!dynamic_scale_) {
    CASTOR_CHECK(std::isfinite(loss), "diverged at step ", step, ": the loss is ", loss,
                 " (try a lower --lr); the newest checkpoint holds the last finite state");
    CASTOR_CHECK(skipped_in_a_row_ < kMaxSkippedStatic, "stopped at step ", step, ": ", skipped_in_a_row_,
                 " steps in a row were skipped because the gradients overflow at the static loss scale ", scale,
                 "; use a lower --loss-scale, or --loss-scale dynamic");
  } else {
    CASTOR_CHECK(skipped_in_a_row_ < kMaxSkippedInARow && scale >= kMinLossScale, "diverged at step ", step, ": ",
                 skipped_in_a_row_, " skipped steps in a row, loss scale ", scale,
                 " (try a lower --lr); the newest checkpoint holds the last finite state");
  }
}

}  // namespace castor::train
