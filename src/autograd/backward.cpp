// The backward rules of the ops not yet migrated to typed definitions (autograd/defs/legacy.h), in one switch keyed
// by op kind. Rules are written with differentiable ops, so that with create_graph the gradient itself has history
// (double backward); fused kernels serve the common case.
#include "autograd/defs/linalg.h"
#include "autograd/op_def.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "kernels/kernels.h"
#include "autograd/layer_rules.h"

namespace castor {

using kernels::Binary;

Tensor fused(Binary op, const Tensor& g, const Tensor& x) {
  const Tensor xc = x.is_dense() ? x : x.contiguous();
  Tensor out = empty_like(xc), gc = g;
  if (g.dtype() != xc.dtype() || !same_layout(g, xc)) {
    gc = empty_like(xc);
    kernels::copy(g, gc);
  }
  kernels::binary(op, gc, xc, out);
  return out;
}

namespace {

Tensor mask(const Tensor& cond, DType dtype) { return cond.to(dtype); }

// Places `g` (shaped like the reduced output) back into a zero tensor of `shape` at `indices` along `dim`.
Tensor scatter_into(const Shape& shape, int64_t dim, const Tensor& indices, const Tensor& g) {
  Tensor out = empty(shape, g.dtype());
  const Tensor ic = indices.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  kernels::scatter_add_dim(g.contiguous(), ic, outer, shape[dim], ic.numel() / (outer * inner), inner, out);
  return out;
}

// The adjoint of x.slice(dim, start, ..., step) for x of `shape`, written with differentiable ops (double backward):
// g's rows spaced `step` apart by zero rows, then zeros before and after.
Tensor unslice(const Tensor& g, const Shape& shape, int64_t dim, int64_t start, int64_t step) {
  Tensor spread = g;
  const int64_t n = g.size(dim);
  if (step > 1 && n > 0) {
    Shape zs = g.shape();
    zs.insert(zs.begin() + dim + 1, step - 1);
    Shape flat = g.shape();
    flat[dim] = n * step;
    spread = cat({g.unsqueeze(dim + 1), zeros(zs, g.dtype())}, dim + 1).reshape(flat).narrow(dim, 0, (n - 1) * step + 1);
  }
  std::vector<Tensor> parts;
  auto zero_rows = [&](int64_t rows) {
    Shape zs = shape;
    zs[dim] = rows;
    if (rows > 0) parts.push_back(zeros(zs, g.dtype()));
  };
  zero_rows(start);
  parts.push_back(spread);
  zero_rows(shape[dim] - start - spread.size(dim));
  return cat(parts, dim);
}

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
    case OpKind::Mm:
    case OpKind::Bmm: {
      const bool need_a = node.next[0].valid(), need_b = node.next[1].valid();
      auto [diff_a, diff_b] = product_grads(need_b ? node.saved_tensor(0) : Tensor(), node.saved_tensor(1), g, need_a,
                                            need_b);
      return {diff_a, diff_b};
    }
    case OpKind::View: return {g.reshape(s0)};
    case OpKind::Permute: {
      const Shape& order = node.param<op_params::Permute>().order;
      Shape inverse(order.size());
      for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
      return {g.permute(inverse)};
    }
    case OpKind::Expand: return {sum_to(g, s0)};
    case OpKind::Slice: {
      const auto [dim, start, step] = node.param<op_params::Slice>();
      if (create_graph) return {unslice(g, s0, dim, start, step)};
      Tensor out = zeros(s0, g.dtype());
      NoGradGuard no_grad;
      out.slice(dim, start, start + (g.size(dim) - 1) * step + 1, step).copy_(g);
      return {out};
    }
    case OpKind::Clone: return {g};
    case OpKind::Cat: {
      const auto& [dim, sizes] = node.param<op_params::Cat>();
      std::vector<Tensor> grads;
      int64_t at = 0;
      for (int64_t size : sizes) {
        grads.push_back(g.narrow(dim, at, size));
        at += size;
      }
      return grads;
    }
    case OpKind::Gather:
      CASTOR_CHECK(!g.requires_grad(), "gather: double backward is not supported");
      return {scatter_into(s0, node.param<op_params::Dim>().dim, node.saved_tensor(0), g)};
    case OpKind::Conv2d: return layer_rules::conv2d(node, g);
    case OpKind::Conv2dMaxPool2dRelu: return layer_rules::conv2d_max_pool2d_relu(node, std::move(g));
    case OpKind::BatchNorm: return layer_rules::batch_norm(node, g);
    case OpKind::MaxPool2d: return layer_rules::max_pool2d(node, g);
    case OpKind::AvgPool2d: return layer_rules::avg_pool2d(node, g);
    case OpKind::Function: return node.function->backward(node, g);
    default:
      break;
  }
  CASTOR_ASSERT(false, "no backward rule recorded for ", op_name(node.op));
}

}  // namespace castor
