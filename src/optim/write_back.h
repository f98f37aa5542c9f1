// An optimizer's write-back as the kernels take it.
#pragma once
#include "castor/optim.h"
#include "kernels/kernels.h"

namespace castor::optim {

// `wb` must outlive the returned view (it points at wb.param).
inline kernels::RoundInto round_into(const WriteBack& wb) {
  return {wb.param.defined() ? &wb.param : nullptr, wb.stochastic, wb.key};
}

}  // namespace castor::optim
