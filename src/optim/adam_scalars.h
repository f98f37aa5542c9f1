// The scalars of one Adam/AdamW step, shared by Adam and AdamW8bit.
#pragma once
#include "kernels/kernels.h"

namespace castor::optim {

struct AdamScalars {
  double beta1, beta2, eps;
  bool decoupled;  // AdamW's weight decay
};
// PyTorch 1.13's: the bias corrections of step `step` (already counted) in double, every scalar rounded to float32.
kernels::AdamUpdate adam_scalars(const AdamScalars& a, double lr, double weight_decay, float step);

}  // namespace castor::optim
