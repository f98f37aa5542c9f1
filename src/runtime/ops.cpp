// The public tensor ops that are not op rows (whose forwards are in src/ops/): checks, sum_to, and the
// in-place ops, which rebase their tensor's history onto the out-of-place op they run.
#include "castor/ops.h"

#include <cmath>

#include "autograd/node.h"
#include "castor/autograd.h"
#include "kernels/kernels.h"
#include "runtime/dispatch.h"

namespace castor {

using kernels::Binary;

// ---- checks ----

bool isfinite_all(const Tensor& a) { return kernels::all_finite(a); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CASTOR_CHECK(a.shape() == b.shape(), "allclose: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i]) || std::abs(x[i] - y[i]) > atol + rtol * std::abs(y[i])) return false;
  }
  return true;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  Tensor r = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return r.view(shape);
}

// ---- in-place ops ----

namespace {

// Runs an in-place op: computes `f(self)` out of place, writes it into self and bumps the version.
// When autograd must see it, self's history is rebased onto the op (PyTorch's semantics).
template <class F>
Tensor& inplace(Tensor& self, const char* op, bool other_requires_grad, F f) {
  const bool track = GradMode::is_enabled() && (self.requires_grad() || other_requires_grad);
  if (!track) {
    Tensor r;
    {
      NoGradGuard no_grad;
      r = f(self);
    }
    CASTOR_CHECK(r.shape() == self.shape(), op, ": the result of shape ", shape_str(r.shape()),
                 " does not fit the in-place output ", self.describe());
    if (!r.is_same(self)) kernels::copy(r, self);
    self.bump_version();
    return self;
  }
  CASTOR_CHECK(!(self.is_leaf() && self.requires_grad()), op, ": a leaf tensor that requires grad (", self.describe(),
               ") cannot be changed in place outside no_grad");
  // Views do not know their base, so the base's history could not be rebased: refuse rather than give its
  // users wrong gradients.
  if (self.grad_fn()) {
    const OpKind k = self.grad_fn()->op;
    CASTOR_CHECK(k != OpKind::View && k != OpKind::Permute && k != OpKind::Expand && k != OpKind::Slice, op,
                 ": in-place change of a view (made by ", op_name(k), ") of a tensor that requires grad (",
                 self.describe(), ") is not supported; clone() the view or use the out-of-place op");
  }
  auto alias = std::make_shared<TensorImpl>(*self.impl());
  alias->hooks.clear();
  if (other_requires_grad) {
    // The op may save self's old value for the other operand's gradient (mul_, div_): like PyTorch, it gets a
    // copy that the write below does not change.
    const Tensor old = self.detach().clone();
    alias->storage = old.impl()->storage;
    alias->strides = old.strides();
    alias->offset = 0;
  }
  Tensor r = f(Tensor(alias));
  CASTOR_CHECK(r.shape() == self.shape(), op, ": the result of shape ", shape_str(r.shape()),
               " does not fit the in-place output ", self.describe());
  if (r.dtype() != self.dtype()) r = r.to(self.dtype());
  kernels::copy(r, self);
  self.bump_version();
  self.impl()->grad_fn = r.grad_fn();
  return self;
}

// The fast path for optimizer-style updates: contiguous self, `other` of self's dtype and shape (or one
// element), no autograd.
bool direct_binary(Tensor& self, const Tensor& other, Binary op, double alpha) {
  if (GradMode::is_enabled() && (self.requires_grad() || other.requires_grad())) return false;
  if (!self.is_contiguous() || !other.is_contiguous() || other.dtype() != self.dtype()) return false;
  if (other.shape() != self.shape() && other.numel() != 1) return false;
  if (!is_floating(self.dtype())) return false;
  kernels::binary(op, self, other, self, alpha);
  self.bump_version();
  return true;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (direct_binary(*this, other, Binary::Add, alpha)) return *this;
  return inplace(*this, "add_", other.requires_grad(), [&](const Tensor& x) { return add(x, other, alpha); });
}
Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  if (direct_binary(*this, other, Binary::Sub, alpha)) return *this;
  return inplace(*this, "sub_", other.requires_grad(), [&](const Tensor& x) { return sub(x, other, alpha); });
}
Tensor& Tensor::mul_(const Tensor& other) {
  if (direct_binary(*this, other, Binary::Mul, 1.0)) return *this;
  return inplace(*this, "mul_", other.requires_grad(), [&](const Tensor& x) { return mul(x, other); });
}
Tensor& Tensor::div_(const Tensor& other) {
  if (direct_binary(*this, other, Binary::Div, 1.0)) return *this;
  return inplace(*this, "div_", other.requires_grad(), [&](const Tensor& x) { return div(x, other); });
}
Tensor& Tensor::add_(double v) {
  return inplace(*this, "add_", false, [&](const Tensor& x) { return add(x, v).to(x.dtype()); });
}
Tensor& Tensor::mul_(double v) {
  return inplace(*this, "mul_", false, [&](const Tensor& x) { return mul(x, v).to(x.dtype()); });
}
Tensor& Tensor::div_(double v) { return mul_(1.0 / v); }
Tensor& Tensor::clamp_(double lo, double hi) {
  return inplace(*this, "clamp_", false, [&](const Tensor& x) { return clamp(x, lo, hi); });
}
Tensor& Tensor::copy_(const Tensor& src) {
  return inplace(*this, "copy_", src.requires_grad(), [&](const Tensor& x) {
    Tensor s = src.expand(x.shape());
    return s.dtype() == x.dtype() ? s.clone() : s.to(x.dtype());
  });
}
Tensor& Tensor::fill_(double value) {
  CASTOR_CHECK(!(GradMode::is_enabled() && requires_grad()), "fill_: ", describe(),
               " requires grad; fill it under no_grad");
  kernels::fill(*this, value);
  bump_version();
  return *this;
}

}  // namespace castor
