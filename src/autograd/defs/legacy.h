// The op rows still on backward.cpp's switch (LegacyOp) and those recorded only as their parts (CompositeOp).
// Migrating a family moves its rows out of here into its own defs/<family>.h (defs/linalg.h holds addmm; mm and bmm
// still use its shared gradient rule from the switch).
#pragma once
#include "autograd/op_def.h"

namespace castor {

#define CASTOR_LEGACY(e) \
  template <>            \
  struct OpDef<OpKind::e> : LegacyOp {};
#define CASTOR_COMPOSITE(e) \
  template <>               \
  struct OpDef<OpKind::e> : CompositeOp {};

CASTOR_LEGACY(Mm) CASTOR_LEGACY(Bmm) CASTOR_LEGACY(View) CASTOR_LEGACY(Permute) CASTOR_LEGACY(Expand)
CASTOR_LEGACY(Slice) CASTOR_LEGACY(Clone) CASTOR_LEGACY(Cat) CASTOR_LEGACY(Gather) CASTOR_LEGACY(Conv2d)
CASTOR_LEGACY(Conv2dMaxPool2dRelu) CASTOR_LEGACY(BatchNorm) CASTOR_LEGACY(MaxPool2d) CASTOR_LEGACY(AvgPool2d)
CASTOR_LEGACY(Function)

CASTOR_COMPOSITE(Matmul) CASTOR_COMPOSITE(Stack) CASTOR_COMPOSITE(Linear) CASTOR_COMPOSITE(Dropout)
CASTOR_COMPOSITE(NllLoss) CASTOR_COMPOSITE(MseLoss) CASTOR_COMPOSITE(BinaryCrossEntropyWithLogits)
CASTOR_COMPOSITE(BinaryCrossEntropy) CASTOR_COMPOSITE(MaskedFill)

#undef CASTOR_LEGACY
#undef CASTOR_COMPOSITE

}  // namespace castor
