// The backward rules of the ops not yet migrated to typed definitions (autograd/defs/legacy.h), in one switch keyed
// by op kind. Rules are written with differentiable ops, so that with create_graph the gradient itself has history
// (double backward); fused kernels serve the common case.
#include "autograd/defs/shape.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "kernels/kernels.h"

namespace castor {

using kernels::Binary;

namespace {

Tensor mask(const Tensor& cond, DType dtype) { return cond.to(dtype); }

// The gradient of a reduction (shaped like its output) brought back to the keepdim shape.
Tensor unreduce(const Node& node, const Tensor& g) {
  const auto& r = node.param<op_params::Reduce>();
  if (r.keepdim) return g;
  Shape keep = node.input_shapes[0];
  for (int64_t d : r.dims) keep[d] = 1;
  return g.reshape(keep);
}

}  // namespace

std::vector<Tensor> apply_legacy_rule(const Node& node, Tensor g) {
  const bool create_graph = GradMode::is_enabled();
  const Shape& s0 = node.input_shapes[0];
  auto scalar = [&] { return node.param<op_params::Scalar>().value; };
  switch (node.op) {
    case OpKind::Add:
      if (node.next.size() == 1) return {g};
      return {sum_to(g, s0), sum_to(scalar() == 1.0 ? g : g * scalar(), node.input_shapes[1])};
    case OpKind::Sub:
      return {sum_to(g, s0), sum_to(g * -scalar(), node.input_shapes[1])};
    case OpKind::Mul: {
      if (node.next.size() == 1) return {g * scalar()};
      // Fetch only the saved tensor a gradient needs: the other may since have been changed in place (x.mul_(c)).
      return {node.next[0].valid() ? sum_to(g * node.saved_tensor(1), s0) : Tensor(),
              node.next[1].valid() ? sum_to(g * node.saved_tensor(0), node.input_shapes[1]) : Tensor()};
    }
    case OpKind::Div: {
      // PyTorch's formulas and rounding order: grad / b and -grad * ((a / b) / b) (no b * b to overflow).
      const Tensor& b = node.saved_tensor(1);
      return {node.next[0].valid() ? sum_to(g / b, s0) : Tensor(),
              node.next[1].valid() ? sum_to(-g * ((node.saved_tensor(0) / b) / b), node.input_shapes[1]) : Tensor()};
    }
    case OpKind::Neg: return {-g};
    case OpKind::Pow: {
      const double e = scalar();
      const Tensor& x = node.saved_tensor(0);
      return {e == 2.0 ? g * x * 2.0 : g * pow(x, e - 1.0) * e};
    }
    case OpKind::Exp: return {g * node.saved_output(0)};
    case OpKind::Log: return {g / node.saved_tensor(0)};
    case OpKind::Sqrt: return {g / (node.saved_output(0) * 2.0)};
    case OpKind::Abs: {
      const Tensor& x = node.saved_tensor(0);
      Tensor zero = zeros({}, x.dtype());
      return {g * (mask(gt(x, zero), g.dtype()) - mask(lt(x, zero), g.dtype()))};
    }
    case OpKind::Relu: {
      const Tensor& x = node.saved_tensor(0);
      if (create_graph) return {g * mask(gt(x, zeros({}, x.dtype())), g.dtype())};
      return {fused(Binary::ReluGrad, g, x)};
    }
    case OpKind::Sigmoid: {
      const Tensor y = node.saved_output(0);
      if (create_graph) return {g * y * (1.0 - y)};
      return {fused(Binary::SigmoidGrad, g, y)};
    }
    case OpKind::Tanh: {
      const Tensor y = node.saved_output(0);
      if (create_graph) return {g * (1.0 - y * y)};
      return {fused(Binary::TanhGrad, g, y)};
    }
    case OpKind::Clamp: {
      // PyTorch's where(min <= x <= max, g, 0): +0 outside, whatever g's sign.
      const Tensor& x = node.saved_tensor(0);
      const auto& c = node.param<op_params::Clamp>();
      Tensor zero = zeros({}, g.dtype());
      return {where(ge(x, scalar_tensor(c.min, DType::Float64)),
                    where(le(x, scalar_tensor(c.max, DType::Float64)), g, zero), zero)};
    }
    case OpKind::Where: {
      const Tensor& c = node.saved_tensor(0);
      Tensor zero = zeros({}, g.dtype());
      return {node.next[0].valid() ? sum_to(where(c, g, zero), s0) : Tensor(),
              node.next[1].valid() ? sum_to(where(c, zero, g), node.input_shapes[1]) : Tensor()};
    }
    case OpKind::Cast: return {g};  // the engine casts it back to the source dtype
    case OpKind::Sum: return {unreduce(node, g).expand(s0)};
    case OpKind::Mean: return {unreduce(node, g).expand(s0) / node.param<op_params::Reduce>().count};
    case OpKind::MaxDim:
    case OpKind::MinDim: {
      const auto [dim, keepdim] = node.param<op_params::Dim>();
      CASTOR_CHECK(!g.requires_grad(), op_name(node.op), ": double backward is not supported");
      Tensor idx = node.saved_tensor(0), gk = g;
      if (!keepdim) {
        idx = idx.unsqueeze(dim);
        gk = g.unsqueeze(dim);
      }
      return {scatter_into(s0, dim, idx, gk)};
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const bool log = node.op == OpKind::LogSoftmax;
      const Tensor y = node.saved_output(0);
      const int64_t dim = node.param<op_params::Dim>().dim;
      if (create_graph) {
        Tensor p = log ? exp(y) : y;
        return {log ? g - p * sum(g, {dim}, true) : y * (g - sum(g * y, {dim}, true))};
      }
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < dim; ++d) outer *= s0[d];
      for (size_t d = dim + 1; d < s0.size(); ++d) inner *= s0[d];
      Tensor out = empty(s0, node.input_dtypes[0]);
      kernels::softmax_backward_dim(g.contiguous(), y.contiguous(), outer, s0.empty() ? 1 : s0[dim], inner, log, out);
      return {out};
    }
    default:
      break;
  }
  CASTOR_ASSERT(false, "no backward rule recorded for ", op_name(node.op));
}

}  // namespace castor
