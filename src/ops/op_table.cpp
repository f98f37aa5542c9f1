// The backward table, one entry per op row, each taken from the op's definition (ops/op_def.h): an op
// without a definition does not compile.
#include <type_traits>

#include "ops/activation.h"
#include "ops/composite.h"
#include "ops/elementwise.h"
#include "ops/function.h"
#include "ops/layers.h"
#include "ops/linalg.h"
#include "ops/reduction.h"
#include "ops/shape.h"
#include "ops/transformer.h"

namespace castor {

namespace {

using BackwardFn = std::vector<Tensor> (*)(const Node&, Tensor);

template <OpKind K>
std::vector<Tensor> run_backward(const Node& node, Tensor grad) {
  using Def = OpDef<K>;
  if constexpr (std::is_base_of_v<CompositeOp, Def>) {
    CASTOR_ASSERT(false, op_name(K), " is recorded as the ops it is made of, never as itself");
    return {};
  } else {
    const auto& st = op_state<K>(node);
    return Def::backward(node, st.params, st.saved, std::move(grad));
  }
}

constexpr BackwardFn kBackward[] = {
#define CASTOR_OP_BACKWARD(e, n, p) &run_backward<OpKind::e>,
    CASTOR_FORALL_OPS(CASTOR_OP_BACKWARD)
#undef CASTOR_OP_BACKWARD
};
static_assert(sizeof(kBackward) / sizeof(kBackward[0]) == kNumOps);

}  // namespace

std::vector<Tensor> apply_backward_rule(const Node& node, Tensor grad) {
  return kBackward[static_cast<int>(node.op)](node, std::move(grad));
}

}  // namespace castor
