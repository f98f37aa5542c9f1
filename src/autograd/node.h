// The autograd graph node: one per recorded op, with its inputs' edges and what its backward rule needs.
#pragma once
#include <memory>
#include <vector>

#include "castor/op_kind.h"
#include "castor/tensor.h"

namespace castor {

// Where an input's gradient goes: the node that made it, or the leaf it is.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return fn || leaf; }
};

struct SavedTensor {
  Tensor tensor;
  uint32_t version = 0;
  bool output = false;  // the node's own output, kept without its history (ops/op_def.h: save_output)
};

// The typed parameters and saved tensors of a node recorded by an op definition (ops/op_def.h).
struct NodeState {
  virtual ~NodeState() = default;
  virtual void release() = 0;  // frees the saved tensors (after a backward without retain_graph)
};

struct Node : std::enable_shared_from_this<Node> {
  OpKind op;
  uint64_t sequence = 0;            // creation order: later nodes run first in backward
  std::vector<Edge> next;           // one per input, invalid where the input needs no gradient
  std::vector<DType> input_dtypes;  // gradients flow back in these dtypes
  std::vector<Shape> input_shapes;
  DType out_dtype = DType::Float32;
  Shape out_shape;
  std::vector<GradHook> pre_hooks;   // hooks on the output tensor (non-leaf register_hook / retain_grad)
  bool released = false;             // saved tensors freed after a backward without retain_graph
  std::shared_ptr<NodeState> state;  // its definition's parameters and saved tensors (ops/op_def.h)

  // A saved tensor of the node's definition, checked against in-place changes since it was saved; a saved output
  // is given this node as grad_fn while grad mode is on (create_graph), so a rule written with it is
  // differentiable through the output too (PyTorch's unpacked saved outputs).
  Tensor unpack(const SavedTensor& s) const;
};

// Records `op` as the maker of `out` when grad mode is on and some input requires grad (its definition's typed
// state is attached by record_op, ops/op_def.h).
void record(OpKind op, const std::vector<Tensor>& inputs, const Tensor& out);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The .grad of input `i` of `node` when the engine would add that input's gradient into it in place: a leaf with a
// .grad of the input's dtype, shape and a dense layout, no hooks, in a backward that neither captures gradients
// (autograd::grad) nor builds a graph (create_graph); else undefined. A rule may add its gradient for that input into
// it itself (bumping its version) and return an undefined gradient there, sparing a dense temporary (embedding).
Tensor leaf_grad_to_accumulate_into(const Node& node, size_t i);

// The backward rule of `node.op`: one gradient per input (undefined where none is needed). It owns `grad`.
// Dispatched by the op table (ops/op_table.cpp) to the op's definition.
std::vector<Tensor> apply_backward_rule(const Node& node, Tensor grad);

}  // namespace castor
