// The op rows still on backward.cpp's switch (LegacyOp) and those recorded only as their parts (CompositeOp).
// Migrating a family moves its rows out of here into its own defs/<family>.h.
#pragma once
#include "autograd/op_def.h"

namespace castor {

#define CASTOR_LEGACY(e) \
  template <>            \
  struct OpDef<OpKind::e> : LegacyOp {};
#define CASTOR_COMPOSITE(e) \
  template <>               \
  struct OpDef<OpKind::e> : CompositeOp {};

CASTOR_LEGACY(Add) CASTOR_LEGACY(Sub) CASTOR_LEGACY(Mul) CASTOR_LEGACY(Div) CASTOR_LEGACY(Neg) CASTOR_LEGACY(Pow)
CASTOR_LEGACY(Exp) CASTOR_LEGACY(Log) CASTOR_LEGACY(Sqrt) CASTOR_LEGACY(Abs) CASTOR_LEGACY(Relu)
CASTOR_LEGACY(Sigmoid) CASTOR_LEGACY(Tanh) CASTOR_LEGACY(Clamp) CASTOR_LEGACY(Where) CASTOR_LEGACY(Cast)
CASTOR_LEGACY(Sum) CASTOR_LEGACY(Mean) CASTOR_LEGACY(MaxDim) CASTOR_LEGACY(MinDim) CASTOR_LEGACY(Softmax)
CASTOR_LEGACY(LogSoftmax)

CASTOR_COMPOSITE(Matmul) CASTOR_COMPOSITE(Stack) CASTOR_COMPOSITE(Linear) CASTOR_COMPOSITE(Dropout)
CASTOR_COMPOSITE(NllLoss) CASTOR_COMPOSITE(MseLoss) CASTOR_COMPOSITE(BinaryCrossEntropyWithLogits)
CASTOR_COMPOSITE(BinaryCrossEntropy) CASTOR_COMPOSITE(MaskedFill)

#undef CASTOR_LEGACY
#undef CASTOR_COMPOSITE

}  // namespace castor
