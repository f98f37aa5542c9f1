// The op rows recorded only as the ops they are made of (CompositeOp): their forwards build them from other ops, so
// they have no backward of their own; they are rows for autocast's policy and the observers.
#pragma once
#include "ops/op_def.h"

namespace castor {

#define CASTOR_COMPOSITE(e) \
  template <>               \
  struct OpDef<OpKind::e> : CompositeOp {}

CASTOR_COMPOSITE(Matmul);
CASTOR_COMPOSITE(Stack);
CASTOR_COMPOSITE(Linear);
CASTOR_COMPOSITE(Dropout);
CASTOR_COMPOSITE(NllLoss);
CASTOR_COMPOSITE(MseLoss);
CASTOR_COMPOSITE(BinaryCrossEntropyWithLogits);
CASTOR_COMPOSITE(BinaryCrossEntropy);
CASTOR_COMPOSITE(MaskedFill);

#undef CASTOR_COMPOSITE

}  // namespace castor
