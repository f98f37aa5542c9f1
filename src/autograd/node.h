// The autograd graph node: one per recorded op, with its inputs' edges and what its backward rule needs.
#pragma once
#include <memory>
#include <variant>
#include <vector>

#include "castor/op_kind.h"
#include "castor/tensor.h"
#include "kernels/layers.h"

namespace castor {

// What a backward rule needs besides tensors: one small struct per op family, recorded by the op and read by
// its rule through Node::params<P>() (a mismatch is a broken invariant and aborts).
namespace op_params {
struct Dim {  // Gather
  int64_t dim;
};
struct Permute {
  Shape order;
};
struct Slice {
  int64_t dim, start, step;
};
struct Cat {
  int64_t dim;
  Shape sizes;  // of each input along dim
};
struct Pool {
  kernels::Pool2dParams pool;
  MemoryFormat format;  // of the output
};
struct ConvPool {  // Conv2dMaxPool2dRelu: the convolution, its output's (N, O, OH, OW), and the pooling
  kernels::Conv2dParams conv;
  Shape conv_shape;
  kernels::Pool2dParams pool;
};
struct BatchNorm {
  bool training, has_weight, has_bias;
  double eps;
};
}  // namespace op_params

using OpParams = std::variant<std::monostate, op_params::Dim, op_params::Permute, op_params::Slice, op_params::Cat,
                              kernels::Conv2dParams, op_params::Pool, op_params::ConvPool, op_params::BatchNorm>;

// Where an input's gradient goes: the node that made it, or the leaf it is.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return fn || leaf; }
};

struct SavedTensor {
  Tensor tensor;
  uint32_t version = 0;
  bool output = false;  // the node's own output, kept without its history (autograd/op_def.h: save_output)
};

// The typed parameters and saved tensors of a node recorded by an op definition (autograd/op_def.h).
struct NodeState {
  virtual ~NodeState() = default;
  virtual void release() = 0;  // frees the saved tensors (after a backward without retain_graph)
};

// The backward of a user-defined autograd::Function (a node of OpKind::Function).
struct FunctionBackward {
  virtual ~FunctionBackward() = default;
  virtual std::vector<Tensor> backward(const Node& node, const Tensor& grad) = 0;
};

struct Node : std::enable_shared_from_this<Node> {
  OpKind op;
  uint64_t sequence = 0;               // creation order: later nodes run first in backward
  std::vector<Edge> next;              // one per input, invalid where the input needs no gradient
  std::vector<DType> input_dtypes;     // gradients flow back in these dtypes
  std::vector<Shape> input_shapes;
  DType out_dtype = DType::Float32;
  Shape out_shape;
  std::vector<SavedTensor> saved;
  OpParams params;                     // the op's parameters (std::monostate when it has none)
  std::vector<GradHook> pre_hooks;     // hooks on the output tensor (non-leaf register_hook / retain_grad)
  bool released = false;               // saved tensors freed after a backward without retain_graph
  std::shared_ptr<FunctionBackward> function;  // OpKind::Function only
  std::shared_ptr<NodeState> state;    // ops with a typed definition (autograd/op_def.h)

  // A saved tensor, checked against in-place changes since it was saved.
  const Tensor& saved_tensor(size_t i) const;
  // A saved output of this node; while grad mode is on (create_graph) it has this node as grad_fn, so a rule
  // written with it is differentiable through the output too (PyTorch's unpacked saved outputs).
  Tensor saved_output(size_t i) const;
  // A saved tensor of a typed definition, checked against in-place changes; an output is given this node as
  // grad_fn while grad mode is on (as saved_output).
  Tensor unpack(const SavedTensor& s) const;
  // The recorded parameters, of the type the op records.
  template <class P>
  const P& param() const {
    const P* p = std::get_if<P>(&params);
    CASTOR_ASSERT(p != nullptr, op_name(op), ": its backward rule reads parameters the op did not record");
    return *p;
  }
};

// Records `op` as the maker of `out` when grad mode is on and some input requires grad.
// `saved` are kept for the backward rule (an output saved here is kept without its history).
void record(OpKind op, const std::vector<Tensor>& inputs, const Tensor& out, std::vector<Tensor> saved = {},
            OpParams params = {});
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The .grad of input `i` of `node` when the engine would add that input's gradient into it in place: a leaf with a
// .grad of the input's dtype, shape and a dense layout, no hooks, in a backward that neither captures gradients
// (autograd::grad) nor builds a graph (create_graph); else undefined. A rule may add its gradient for that input into
// it itself (bumping its version) and return an undefined gradient there, sparing a dense temporary (embedding).
Tensor leaf_grad_to_accumulate_into(const Node& node, size_t i);

// The backward rule of `node.op`: one gradient per input (undefined where none is needed). It owns `grad`.
// Dispatched by the op table (autograd/op_table.cpp) to the op's definition.
std::vector<Tensor> apply_backward_rule(const Node& node, Tensor grad);
// The rules of ops not yet migrated to typed definitions (backward.cpp's switch).
std::vector<Tensor> apply_legacy_rule(const Node& node, Tensor grad);

}  // namespace castor
