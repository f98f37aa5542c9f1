// The public tensor ops not yet in a family of src/autograd/defs/: matrix products, joining and indexing, and the
// in-place ops; autocast via OpScope, kernels, and autograd recording.
#include "castor/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/defs/elementwise.h"
#include "autograd/defs/composite.h"
#include "autograd/defs/linalg.h"
#include "autograd/defs/shape.h"
#include "castor/autograd.h"
#include "runtime/dispatch.h"
#include "kernels/kernels.h"

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

// ---- matrix products ----

Tensor mm(const Tensor& a, const Tensor& b) { return OpDef<OpKind::Mm>::forward(a, b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return OpDef<OpKind::Bmm>::forward(a, b); }

Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2) {
  return OpDef<OpKind::Addmm>::forward(input, mat1, mat2);
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  OpScope s(OpKind::Matmul, {a_in, b_in});
  const Tensor &a = s[0], &b = s[1];
  CASTOR_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got ", a.describe(), " and ",
               b.describe());
  if (a.dim() <= 2 && b.dim() <= 2) {
    Tensor x = a.dim() == 1 ? a.unsqueeze(0) : a, y = b.dim() == 1 ? b.unsqueeze(1) : b;
    Tensor out = OpDef<OpKind::Mm>::run(x, y);
    if (b.dim() == 1) out = out.squeeze(-1);
    if (a.dim() == 1) out = out.squeeze(0);
    return s.done(out);
  }
  // Batched: broadcast the batch dims, then one bmm.
  Tensor x = a.dim() == 1 ? a.unsqueeze(0) : a, y = b.dim() == 1 ? b.unsqueeze(1) : b;
  Shape xb(x.shape().begin(), x.shape().end() - 2), yb(y.shape().begin(), y.shape().end() - 2);
  Shape batch = broadcast_shapes(xb, yb, "matmul");
  const int64_t nb = shape_numel(batch), M = x.size(-2), K = x.size(-1), N = y.size(-1);
  CASTOR_CHECK(K == y.size(-2), "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
               " cannot be multiplied (", K, " != ", y.size(-2), ")");
  Shape xs = batch, ys = batch;
  xs.insert(xs.end(), {M, K});
  ys.insert(ys.end(), {K, N});
  Tensor out = OpDef<OpKind::Bmm>::run(x.expand(xs).reshape({nb, M, K}), y.expand(ys).reshape({nb, K, N}));
  Shape os = batch;
  if (a.dim() > 1) os.push_back(M);
  if (b.dim() > 1) os.push_back(N);
  return s.done(out.view(os));
}

// ---- joining and indexing ----

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) { return OpDef<OpKind::Cat>::forward(tensors, dim); }

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

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  return OpDef<OpKind::Gather>::forward(a, dim, index);
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
