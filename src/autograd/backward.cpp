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

namespace {

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

}  // namespace

std::vector<Tensor> apply_legacy_rule(const Node& node, Tensor g) {
  const bool create_graph = GradMode::is_enabled();
  const Shape& s0 = node.input_shapes[0];
  switch (node.op) {
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
