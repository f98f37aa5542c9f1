// The reductions: each op's forward (the public function) on the reduction kernels beside its backward, over a plan
// that lays the reduced dims out adjacent (outer, n, inner).
#include "ops/reduction.h"

#include <algorithm>
#include <optional>

#include "castor/ops.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {

// The reduced dims (sorted, unique) and the (outer, n, inner) split of a contiguous tensor laid out so
// that they are adjacent; `perm` is the permutation that makes them so (empty when none is needed).
struct Reduction {
  std::vector<int64_t> dims;
  Shape out_shape, keep_shape, perm;
  int64_t outer = 1, n = 1, inner = 1;
};

Reduction plan_reduction(const Tensor& a, const Shape& dims_in, bool keepdim, const char* op) {
  Reduction r;
  const int64_t nd = a.dim();
  if (dims_in.empty()) {
    for (int64_t d = 0; d < nd; ++d) r.dims.push_back(d);
  } else {
    for (int64_t d : dims_in) r.dims.push_back(wrap_dim(d, nd, op));
    std::sort(r.dims.begin(), r.dims.end());
    CASTOR_CHECK(std::adjacent_find(r.dims.begin(), r.dims.end()) == r.dims.end(), op, ": dim repeated in ",
                 shape_str(dims_in));
  }
  std::vector<bool> reduced(nd, false);
  for (int64_t d : r.dims) reduced[d] = true;
  for (int64_t d = 0; d < nd; ++d) {
    r.keep_shape.push_back(reduced[d] ? 1 : a.shape()[d]);
    if (!reduced[d]) r.out_shape.push_back(a.shape()[d]);
    if (reduced[d]) r.n *= a.shape()[d];
  }
  if (keepdim) r.out_shape = r.keep_shape;
  const bool adjacent = r.dims.empty() || r.dims.back() - r.dims.front() + 1 == static_cast<int64_t>(r.dims.size());
  if (adjacent && !r.dims.empty()) {
    for (int64_t d = 0; d < r.dims.front(); ++d) r.outer *= a.shape()[d];
    for (int64_t d = r.dims.back() + 1; d < nd; ++d) r.inner *= a.shape()[d];
  } else if (!r.dims.empty()) {
    for (int64_t d = 0; d < nd; ++d)
      if (!reduced[d]) r.perm.push_back(d), r.outer *= a.shape()[d];
    r.perm.insert(r.perm.end(), r.dims.begin(), r.dims.end());
  }
  return r;
}

Tensor reduction_input(const Tensor& a, const Reduction& r) {
  Tensor x = a.detach();
  if (!r.perm.empty()) x = x.permute(r.perm);
  return x.contiguous();
}

// x summed (`mean`: averaged) as planned, into a new tensor of `dtype`.
Tensor sum_planned(const Tensor& x, const Reduction& r, DType dtype, bool mean) {
  Tensor out = empty(r.out_shape, dtype);
  if (r.dims.empty() && x.dim() > 0) {
    kernels::copy(x.detach(), out);
  } else {
    kernels::sum_dim(reduction_input(x, r), r.outer, r.n, r.inner, out);
    if (mean) kernels::unary(kernels::Unary::MulScalar, out, out, 1.0 / static_cast<double>(r.n));
  }
  return out;
}

// The gradient of a reduction over `dims` of a src of `shape`, brought back to src's shape.
Tensor unreduce(const Tensor& g, const Shape& shape, const Shape& dims, bool keepdim) {
  if (keepdim) return g.expand(shape);
  Shape keep = shape;
  for (int64_t d : dims) keep[d] = 1;
  return g.reshape(keep).expand(shape);
}

}  // namespace

Tensor scatter_into(const Shape& shape, int64_t dim, const Tensor& indices, const Tensor& g) {
  Tensor out = empty(shape, g.dtype());
  const Tensor ic = indices.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  kernels::scatter_add_dim(g.contiguous(), ic, outer, shape[dim], ic.numel() / (outer * inner), inner, out);
  return out;
}

// ---- sum and mean ----

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  OpScope s(OpKind::Sum, {a});
  const Tensor& x = s[0];
  const Reduction r = plan_reduction(x, dims, keepdim, "sum");
  Tensor out = sum_planned(x, r, dtype.value_or(is_floating(x.dtype()) ? x.dtype() : DType::Int64), false);
  record_op<OpKind::Sum>({x}, out, {r.dims, keepdim}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Sum>::backward(const Node& node, const Params& p, const Saved&, Tensor g) {
  return {unreduce(g, node.input_shapes[0], p.dims, p.keepdim)};
}

Tensor mean(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  OpScope s(OpKind::Mean, {a});
  const Tensor& x = s[0];
  const Reduction r = plan_reduction(x, dims, keepdim, "mean");
  const DType dt = dtype.value_or(is_floating(x.dtype()) ? x.dtype() : DType::Int64);
  CASTOR_CHECK(is_floating(dt), "mean: needs a floating dtype, got ", dtype_name(dt));
  Tensor out = sum_planned(x, r, dt, true);
  record_op<OpKind::Mean>({x}, out, {r.dims, keepdim, static_cast<double>(r.n)}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Mean>::backward(const Node& node, const Params& p, const Saved&, Tensor g) {
  return {unreduce(g, node.input_shapes[0], p.dims, p.keepdim) / p.count};
}

// ---- max and min along a dim ----

namespace {

template <OpKind K>
std::pair<Tensor, Tensor> extreme(const Tensor& a, int64_t dim, bool keepdim) {
  constexpr bool is_max = K == OpKind::MaxDim;
  OpScope s(K, {a});
  const Tensor& x = s[0];
  const Reduction r = plan_reduction(x, {dim}, keepdim, op_name(K));
  Tensor values = empty(r.out_shape, x.dtype()), indices = empty(r.out_shape, DType::Int64);
  kernels::extreme_dim(reduction_input(x, r), r.outer, r.n, r.inner, is_max, values, indices);
  record_op<K>({x}, values, {r.dims[0], keepdim}, {save(indices)});
  return {s.done(values), indices};
}

}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme<OpKind::MaxDim>(a, dim, keepdim);
}
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme<OpKind::MinDim>(a, dim, keepdim);
}
Tensor max(const Tensor& a) { return extreme<OpKind::MaxDim>(a.detach().reshape({-1}), 0, false).first; }
Tensor min(const Tensor& a) { return extreme<OpKind::MinDim>(a.detach().reshape({-1}), 0, false).first; }
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme<OpKind::MaxDim>(a.detach(), dim, keepdim).second;
}

std::vector<Tensor> ExtremeDimDef::backward(const Node& node, const Params& p, const Saved& s, Tensor g) {
  CASTOR_CHECK(!g.requires_grad(), op_name(node.op), ": double backward is not supported");
  Tensor idx = node.unpack(s.indices), gk = g;
  if (!p.keepdim) {
    idx = idx.unsqueeze(p.dim);
    gk = g.unsqueeze(p.dim);
  }
  return {scatter_into(node.input_shapes[0], p.dim, idx, gk)};
}

// ---- softmax and log-softmax ----

namespace {

template <OpKind K>
Tensor softmax_like(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  OpScope s(K, {a});
  const Tensor& x = s[0];
  CASTOR_CHECK(is_floating(x.dtype()), op_name(K), ": needs a floating-point input, got ", x.describe());
  const Reduction r = plan_reduction(x, {dim}, true, op_name(K));
  Tensor out = empty(x.shape(), dtype.value_or(x.dtype()));
  kernels::softmax_dim(x.detach().contiguous(), r.outer, r.n, r.inner, K == OpKind::LogSoftmax, out);
  record_op<K>({x}, out, {r.dims[0]}, {save_output(out)});
  return s.done(out);
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return softmax_like<OpKind::Softmax>(a, dim, dtype);
}
Tensor log_softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return softmax_like<OpKind::LogSoftmax>(a, dim, dtype);
}

std::vector<Tensor> SoftmaxDef::backward(const Node& node, const Params& p, const Saved& s, Tensor g) {
  const bool log = node.op == OpKind::LogSoftmax;
  const Tensor y = node.unpack(s.dst);
  const int64_t dim = p.dim;
  if (GradMode::is_enabled()) {  // create_graph
    Tensor probs = log ? exp(y) : y;
    return {log ? g - probs * sum(g, {dim}, true) : y * (g - sum(g * y, {dim}, true))};
  }
  const Shape& shape = node.input_shapes[0];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  Tensor out = empty(shape, node.input_dtypes[0]);
  kernels::softmax_backward_dim(g.contiguous(), y.contiguous(), outer, shape.empty() ? 1 : shape[dim], inner, log, out);
  return {out};
}

}  // namespace castor
