// Tensor methods that record for autograd or run kernels: gradient metadata, views, copies, filled factories.
#include <numeric>
#include <optional>

#include "autograd/node.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "core/view.h"
#include "kernels/kernels.h"

namespace castor {

// ---- autograd metadata ----

bool Tensor::requires_grad() const { return d().requires_grad || impl_->grad_fn != nullptr; }

Tensor& Tensor::requires_grad_(bool requires_grad) {
  CASTOR_CHECK(is_leaf() || requires_grad, "requires_grad_(false) on a non-leaf tensor ", describe(),
               ": use detach()");
  CASTOR_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating-point tensors can require "
               "gradients, got ", describe());
  impl_->requires_grad = requires_grad;
  return *this;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  castor::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                   retain_graph, create_graph);
}

void Tensor::register_hook(GradHook hook) const {
  CASTOR_CHECK(requires_grad(), "register_hook on a tensor that does not require grad (", describe(), ")");
  if (is_leaf())
    impl_->hooks.push_back(std::move(hook));
  else
    impl_->grad_fn->pre_hooks.push_back(std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  CASTOR_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: only a leaf that requires grad "
               "accumulates a gradient, got ", describe());
  impl_->post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  if (is_leaf() || impl_->retains_grad) return;
  impl_->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  impl_->grad_fn->pre_hooks.push_back([weak](const Tensor& g) {
    if (auto self = weak.lock()) {
      Tensor s(self);
      s.set_grad(s.grad().defined() ? add(s.grad(), g.detach()) : g.detach().clone());
    }
    return Tensor();
  });
}

// ---- views ----

static Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
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

// Strides for viewing `t` as `shape` without a copy, or empty if impossible (PyTorch's computeStride).
static std::optional<Shape> view_strides(const Tensor& t, const Shape& shape) {
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

Tensor Tensor::view(const Shape& new_shape) const {
  Shape shape = infer_shape(new_shape, numel(), "view");
  auto strides = view_strides(*this, shape);
  CASTOR_CHECK(strides.has_value(), "view: cannot view a tensor of shape ", shape_str(this->shape()), " and strides ",
               shape_str(this->strides()), " as ", shape_str(shape), "; use reshape()");
  Tensor out = make_view(*this, shape, *strides, storage_offset());
  record(OpKind::View, {*this}, out);
  return out;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape shape = infer_shape(new_shape, numel(), "reshape");
  if (view_strides(*this, shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::permute(const Shape& dims) const {
  CASTOR_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(), " dims given for a tensor of ",
               dim(), " dims");
  Shape shape(dims.size()), strides(dims.size()), wrapped(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    CASTOR_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    wrapped[i] = d;
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  Tensor out = make_view(*this, shape, strides, storage_offset());
  record(OpKind::Permute, {*this}, out, {}, op_params::Permute{wrapped});
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Shape dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  if (dim() == 0) return *this;
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  CASTOR_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = make_view(*this, shape, strides, storage_offset() + start * this->strides()[d]);
  record(OpKind::Slice, {*this}, out, {}, op_params::Slice{d, start, step});
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  CASTOR_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: range [", start, ", ",
               start + length, ") out of bounds for dim ", d, " of size ", shape()[d]);
  return slice(d, start, start + length);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  d = wrap_dim(d, dim(), "split");
  const int64_t n = shape()[d];
  CASTOR_CHECK(split_size > 0 || n == 0, "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> parts;
  for (int64_t at = 0; at < n; at += split_size) parts.push_back(narrow(d, at, std::min(split_size, n - at)));
  return parts;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  CASTOR_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  d = wrap_dim(d, dim(), "chunk");
  return split(std::max<int64_t>(1, (shape()[d] + chunks - 1) / chunks), d);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  CASTOR_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& new_shape) const {
  CASTOR_CHECK(static_cast<int64_t>(new_shape.size()) >= dim(), "expand: cannot expand ", describe(), " to ",
               shape_str(new_shape));
  size_t lead = new_shape.size() - shape().size();
  Shape shape(new_shape.size()), strides(new_shape.size());
  for (size_t i = 0; i < new_shape.size(); ++i) {
    int64_t want = new_shape[i];
    if (i < lead) {
      CASTOR_CHECK(want >= 0, "expand: invalid size ", want, " in ", shape_str(new_shape));
      shape[i] = want;
      strides[i] = 0;
      continue;
    }
    int64_t have = this->shape()[i - lead];
    if (want == -1) want = have;
    CASTOR_CHECK(have == want || have == 1, "expand: the size ", have, " of dim ", i - lead, " of ", describe(),
                 " cannot become ", want, " (target ", shape_str(new_shape), ")");
    shape[i] = want;
    strides[i] = have == want ? this->strides()[i - lead] : 0;
  }
  if (shape == this->shape()) return *this;
  Tensor out = make_view(*this, shape, strides, storage_offset());
  record(OpKind::Expand, {*this}, out);
  return out;
}

Tensor Tensor::squeeze() const {
  Shape shape;
  for (int64_t s : this->shape())
    if (s != 1) shape.push_back(s);
  return view(shape);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[d] != 1) return *this;
  Shape shape = this->shape();
  shape.erase(shape.begin() + d);
  return view(shape);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  shape.insert(shape.begin() + d, 1);
  return view(shape);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return view({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  CASTOR_CHECK(start <= end, "flatten: start_dim ", start, " after end_dim ", end);
  Shape shape(this->shape().begin(), this->shape().begin() + start);
  int64_t n = 1;
  for (int64_t i = start; i <= end; ++i) n *= this->shape()[i];
  shape.push_back(n);
  shape.insert(shape.end(), this->shape().begin() + end + 1, this->shape().end());
  return reshape(shape);
}

// ---- copies ----

// A copy into `out`, recorded as a clone.
static Tensor clone_into(const Tensor& src, Tensor out) {
  kernels::copy(src, out);
  record(OpKind::Clone, {src}, out);
  return out;
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  return is_contiguous(format) ? *this : clone_into(*this, empty(shape(), dtype(), format));
}

Tensor Tensor::clone() const { return clone_into(*this, empty_like(*this)); }

// ---- factories that fill ----

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  kernels::fill(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor scalar_tensor(double value, DType dtype) { return full({}, value, dtype); }
Tensor zeros_like(const Tensor& t) {
  Tensor out = empty_like(t);
  kernels::fill(out, 0.0);
  return out;
}
Tensor ones_like(const Tensor& t) {
  Tensor out = empty_like(t);
  kernels::fill(out, 1.0);
  return out;
}

}  // namespace castor
