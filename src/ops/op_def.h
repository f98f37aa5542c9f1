// An op as one typed definition: its parameters, its named saved tensors and its backward, registered by OpKind.
//
// Each row of CASTOR_FORALL_OPS (castor/op_kind.h) has a specialization OpDef<OpKind::X> in its family's header
// under src/ops/. A typed definition holds
//   struct Params { ... };                         what the backward needs besides tensors
//   struct Saved { SavedTensor a, b; };            the tensors it keeps, by name (derivatives.yaml style)
//   static std::vector<Tensor> backward(const Node&, const Params&, const Saved&, Tensor grad);
// next to the forward that records it with record_op<OpKind::X>(inputs, out, params, saved). The backward table
// (src/ops/op_table.cpp) is built from the op rows, so an op without a definition does not compile.
// Ops recorded only as the ops they are made of derive from CompositeOp (they never record themselves).
#pragma once
#include <memory>
#include <vector>

#include "autograd/node.h"
#include "castor/autograd.h"
#include "kernels/kernels.h"

namespace castor {

template <OpKind K>
struct OpDef;  // one specialization per op row; none here on purpose

struct CompositeOp {};  // recorded as the ops it is made of

// g op x with a fused backward map (kernels::Binary::*Grad; no history), for rules whose composite form is only
// needed for double backward. The result takes x's layout when x is dense (channels-last stays channels-last).
// (ops/elementwise.cpp)
Tensor fused(kernels::Binary op, const Tensor& g, const Tensor& x);

// g (shaped like indices) added into a zero tensor of `shape` at `indices` along `dim`: the gradient of a gather
// or of max/min along a dim (no history). (ops/reduction.cpp)
Tensor scatter_into(const Shape& shape, int64_t dim, const Tensor& indices, const Tensor& g);

// Raises for a backward run with create_graph (grad mode on) by a rule that has no double backward.
inline void check_first_order(const Node& node) {
  CASTOR_CHECK(!GradMode::is_enabled(), op_name(node.op), ": double backward is not supported");
}

// A tensor kept for backward, with its version (an input) or without its history (an output).
inline SavedTensor save(const Tensor& t) { return {t, t.defined() ? t.version() : 0u, false}; }
inline SavedTensor save_output(const Tensor& out) { return {out.detach(), out.version(), true}; }

// The typed state a node of a definition carries.
template <class Def>
struct OpState final : NodeState {
  typename Def::Params params;
  typename Def::Saved saved;
  OpState(typename Def::Params p, typename Def::Saved s) : params(std::move(p)), saved(std::move(s)) {}
  void release() override { saved = {}; }
};

// Records op K as the maker of `out` (when grad mode is on and an input requires grad) with its typed state.
template <OpKind K>
void record_op(const std::vector<Tensor>& inputs, const Tensor& out, typename OpDef<K>::Params params,
               typename OpDef<K>::Saved saved) {
  if (!GradMode::is_enabled() || !any_requires_grad(inputs)) return;
  record(K, inputs, out);
  out.grad_fn()->state = std::make_shared<OpState<OpDef<K>>>(std::move(params), std::move(saved));
}

template <OpKind K>
const OpState<OpDef<K>>& op_state(const Node& node) {
  auto* s = dynamic_cast<const OpState<OpDef<K>>*>(node.state.get());
  CASTOR_ASSERT(s != nullptr, op_name(node.op), ": node has no typed state of its definition");
  return *s;
}

}  // namespace castor
