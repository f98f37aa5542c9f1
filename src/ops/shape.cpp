// Views, clone, cat and gather: each op's forward (a Tensor method or a public function) beside its backward. The
// views alias their input's storage (core/view.h) and pass no OpScope; every backward is written with
// differentiable ops where double backward needs it.
#include "ops/shape.h"

#include <algorithm>
#include <optional>

#include "castor/ops.h"
#include "core/view.h"
#include "runtime/dispatch.h"

namespace castor {

// ---- view ----

namespace {

// `shape` with its one -1 inferred for `numel` elements, checked (op names it in errors).
Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      CASTOR_CHECK(infer < 0, op, ": only one dimension can be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      CASTOR_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    CASTOR_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for input of size ",
                 numel);
    out[infer] = numel / known;
  }
  CASTOR_CHECK(shape_numel(out) == numel, op, ": shape ", shape_str(shape), " is invalid for input of size ", numel);
  return out;
}

// Strides for viewing t as `shape` without a copy, or none where impossible (PyTorch's computeStride).
std::optional<Shape> view_strides(const Tensor& t, const Shape& shape) {
  if (t.numel() == 0 || t.is_contiguous()) return contiguous_strides(shape);
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  Shape strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  const Shape shape = infer_shape(new_shape, numel(), "view");
  auto strides = view_strides(*this, shape);
  CASTOR_CHECK(strides.has_value(), "view: cannot view a tensor of shape ", shape_str(this->shape()), " and strides ",
               shape_str(this->strides()), " as ", shape_str(shape), "; use reshape()");
  Tensor out = make_view(*this, shape, *strides, storage_offset());
  record_op<OpKind::View>({*this}, out, {}, {});
  return out;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape shape = infer_shape(new_shape, numel(), "reshape");
  if (view_strides(*this, shape)) return view(shape);
  return contiguous().view(shape);
}

std::vector<Tensor> OpDef<OpKind::View>::backward(const Node& node, const Params&, const Saved&, Tensor diff_dst) {
  return {diff_dst.reshape(node.input_shapes[0])};
}

// ---- permute ----

Tensor Tensor::permute(const Shape& dims) const {
  const Tensor& src = *this;
  CASTOR_CHECK(static_cast<int64_t>(dims.size()) == src.dim(), "permute: ", dims.size(), " dims given for a tensor of ",
               src.dim(), " dims");
  Shape shape(dims.size()), strides(dims.size()), wrapped(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], src.dim(), "permute");
    CASTOR_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    wrapped[i] = d;
    shape[i] = src.shape()[d];
    strides[i] = src.strides()[d];
  }
  Tensor out = make_view(src, shape, strides, src.storage_offset());
  record_op<OpKind::Permute>({src}, out, {wrapped}, {});
  return out;
}

std::vector<Tensor> OpDef<OpKind::Permute>::backward(const Node&, const Params& p, const Saved&, Tensor diff_dst) {
  Shape inverse(p.order.size());
  for (size_t i = 0; i < p.order.size(); ++i) inverse[p.order[i]] = static_cast<int64_t>(i);
  return {diff_dst.permute(inverse)};
}

// ---- expand ----

Tensor Tensor::expand(const Shape& new_shape) const {
  const Tensor& src = *this;
  CASTOR_CHECK(static_cast<int64_t>(new_shape.size()) >= src.dim(), "expand: cannot expand ", src.describe(), " to ",
               shape_str(new_shape));
  const size_t lead = new_shape.size() - src.shape().size();
  Shape shape(new_shape.size()), strides(new_shape.size());
  for (size_t i = 0; i < new_shape.size(); ++i) {
    int64_t want = new_shape[i];
    if (i < lead) {
      CASTOR_CHECK(want >= 0, "expand: invalid size ", want, " in ", shape_str(new_shape));
      shape[i] = want;
      strides[i] = 0;
      continue;
    }
    const int64_t have = src.shape()[i - lead];
    if (want == -1) want = have;
    CASTOR_CHECK(have == want || have == 1, "expand: the size ", have, " of dim ", i - lead, " of ", src.describe(),
                 " cannot become ", want, " (target ", shape_str(new_shape), ")");
    shape[i] = want;
    strides[i] = have == want ? src.strides()[i - lead] : 0;
  }
  if (shape == src.shape()) return src;
  Tensor out = make_view(src, shape, strides, src.storage_offset());
  record_op<OpKind::Expand>({src}, out, {}, {});
  return out;
}

std::vector<Tensor> OpDef<OpKind::Expand>::backward(const Node& node, const Params&, const Saved&, Tensor diff_dst) {
  return {sum_to(diff_dst, node.input_shapes[0])};
}

// ---- slice ----

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
    spread =
        cat({g.unsqueeze(dim + 1), zeros(zs, g.dtype())}, dim + 1).reshape(flat).narrow(dim, 0, (n - 1) * step + 1);
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

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const Tensor& src = *this;
  d = wrap_dim(d, src.dim(), "slice");
  CASTOR_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = src.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = src.shape(), strides = src.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = make_view(src, shape, strides, src.storage_offset() + start * src.strides()[d]);
  record_op<OpKind::Slice>({src}, out, {d, start, step}, {});
  return out;
}

std::vector<Tensor> OpDef<OpKind::Slice>::backward(const Node& node, const Params& p, const Saved&, Tensor diff_dst) {
  const Shape& shape = node.input_shapes[0];
  if (GradMode::is_enabled()) return {unslice(diff_dst, shape, p.dim, p.start, p.step)};  // create_graph
  Tensor out = zeros(shape, diff_dst.dtype());
  NoGradGuard no_grad;
  out.slice(p.dim, p.start, p.start + (diff_dst.size(p.dim) - 1) * p.step + 1, p.step).copy_(diff_dst);
  return {out};
}

// ---- clone ----

namespace {

// src copied into dst, recorded as a clone.
Tensor clone_into(const Tensor& src, Tensor dst) {
  kernels::copy(src, dst);
  record_op<OpKind::Clone>({src}, dst, {}, {});
  return dst;
}

}  // namespace

Tensor Tensor::clone() const { return clone_into(*this, empty_like(*this)); }

Tensor Tensor::contiguous(MemoryFormat format) const {
  return is_contiguous(format) ? *this : clone_into(*this, empty(shape(), dtype(), format));
}

std::vector<Tensor> OpDef<OpKind::Clone>::backward(const Node&, const Params&, const Saved&, Tensor diff_dst) {
  return {diff_dst};
}

// ---- cat ----

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  CASTOR_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  OpScope s(OpKind::Cat, tensors);
  const auto& in = s.inputs();
  const Tensor& first = in[0];
  dim = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[dim] = 0;
  OpDef<OpKind::Cat>::Params params{dim, {}};
  for (const Tensor& t : in) {
    CASTOR_CHECK(t.dim() == first.dim(), "cat: tensors must have the same number of dims, got ", first.describe(),
                 " and ", t.describe());
    for (int64_t d = 0; d < t.dim(); ++d)
      CASTOR_CHECK(d == dim || t.size(d) == first.size(d), "cat: sizes must match except in dim ", dim, ", got ",
                   first.describe(), " and ", t.describe());
    shape[dim] += t.size(dim);
    params.sizes.push_back(t.size(dim));
  }
  Tensor out = empty(shape, result_type(in));
  int64_t at = 0;
  for (const Tensor& t : in) {
    kernels::copy(t.detach(), out.detach().narrow(dim, at, t.size(dim)));
    at += t.size(dim);
  }
  record_op<OpKind::Cat>(in, out, std::move(params), {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Cat>::backward(const Node&, const Params& p, const Saved&, Tensor diff_dst) {
  std::vector<Tensor> grads;
  int64_t at = 0;
  for (int64_t size : p.sizes) {
    grads.push_back(diff_dst.narrow(p.dim, at, size));
    at += size;
  }
  return grads;
}

// ---- stack (recorded as the cat it runs) ----

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  CASTOR_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  OpScope s(OpKind::Stack, tensors);
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (const Tensor& t : s.inputs()) {
    CASTOR_CHECK(t.shape() == s[0].shape(), "stack: tensors must have the same shape, got ", s[0].describe(), " and ",
                 t.describe());
    parts.push_back(t.unsqueeze(dim));
  }
  return s.done(cat(parts, dim));
}

// ---- gather ----

Tensor gather(const Tensor& src, int64_t dim, const Tensor& index) {
  OpScope s(OpKind::Gather, {src});
  const Tensor& x = s[0];
  dim = wrap_dim(dim, x.dim(), "gather");
  CASTOR_CHECK(index.dtype() == DType::Int64, "gather: index must be int64, got ", index.describe());
  CASTOR_CHECK(index.dim() == x.dim(), "gather: index ", index.describe(), " and input ", x.describe(),
               " must have the same number of dims");
  for (int64_t d = 0; d < x.dim(); ++d)
    CASTOR_CHECK(d == dim || index.size(d) == x.size(d), "gather: index ", index.describe(), " and input ",
                 x.describe(), " differ outside dim ", dim);
  const Tensor xc = x.detach().contiguous(), ic = index.contiguous();
  Tensor out = empty(index.shape(), x.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  kernels::gather_dim(xc, ic, outer, x.size(dim), index.size(dim), inner, out);
  record_op<OpKind::Gather>({x}, out, {dim}, {save(ic)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Gather>::backward(const Node& node, const Params& p, const Saved& s,
                                                    Tensor diff_dst) {
  CASTOR_CHECK(!diff_dst.requires_grad(), "gather: double backward is not supported");
  return {scatter_into(node.input_shapes[0], p.dim, node.unpack(s.index), diff_dst)};
}

}  // namespace castor
