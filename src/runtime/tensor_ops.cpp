// Tensor methods besides the ops' own (ops/): gradient metadata, the views made of other views (transpose,
// narrow, split, select, squeeze, flatten), and filled factories.
#include <numeric>

#include "autograd/node.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "kernels/kernels.h"

namespace castor {

// ---- autograd metadata ----

bool Tensor::requires_grad() const { return d().requires_grad || impl_->grad_fn != nullptr; }

Tensor& Tensor::requires_grad_(bool requires_grad) {
  CASTOR_CHECK(is_leaf() || requires_grad, "requires_grad_(false) on a non-leaf tensor ", describe(), ": use detach()");
  CASTOR_CHECK(!requires_grad || is_floating(dtype()),
               "requires_grad_: only floating-point tensors can require "
               "gradients, got ",
               describe());
  impl_->requires_grad = requires_grad;
  return *this;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  castor::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{}, retain_graph,
                   create_graph);
}

void Tensor::register_hook(GradHook hook) const {
  CASTOR_CHECK(requires_grad(), "register_hook on a tensor that does not require grad (", describe(), ")");
  if (is_leaf())
    impl_->hooks.push_back(std::move(hook));
  else
    impl_->grad_fn->pre_hooks.push_back(std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  CASTOR_CHECK(is_leaf() && requires_grad(),
               "register_post_accumulate_grad_hook: only a leaf that requires grad "
               "accumulates a gradient, got ",
               describe());
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

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Shape dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  if (dim() == 0) return *this;
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(dims);
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
