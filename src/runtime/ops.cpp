// The public tensor ops: autocast via OpScope, promotion and broadcasting, kernels, and autograd recording.
#include "castor/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/defs/activation.h"
#include "autograd/defs/legacy.h"
#include "autograd/defs/linalg.h"
#include "autograd/defs/shape.h"
#include "castor/autograd.h"
#include "runtime/dispatch.h"
#include "kernels/kernels.h"

namespace castor {

using kernels::Binary;
using kernels::Unary;

// ---- type promotion and broadcasting ----

DType result_type(const std::vector<Tensor>& tensors) {
  // PyTorch: dimensioned tensors decide, unless a 0-dim tensor is of a higher category (bool < int < float).
  std::optional<DType> dimmed, zero_dim;
  for (const Tensor& t : tensors) {
    auto& slot = t.dim() > 0 ? dimmed : zero_dim;
    slot = slot ? promote_types(*slot, t.dtype()) : t.dtype();
  }
  if (!dimmed) return *zero_dim;
  if (zero_dim && traits(*zero_dim).category > traits(*dimmed).category) return promote_types(*dimmed, *zero_dim);
  return *dimmed;
}

static Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    CASTOR_CHECK(x == y || x == 1 || y == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                 " cannot be broadcast (dim ", i, ": ", x, " vs ", y, ")");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

// The strides of an element-wise result: those of the first operand of its shape that is dense, so that a
// channels-last input gives a channels-last result (as in PyTorch); contiguous ones otherwise.
static Shape result_strides(const std::vector<Tensor>& operands, const Shape& shape) {
  for (const Tensor& t : operands)
    if (t.shape() == shape && t.is_dense()) return t.strides();
  return contiguous_strides(shape);
}

// x as a tensor of `dtype` laid out like `out` (same_layout), so that kernels run on flat arrays; a single element
// may stay single: kernels broadcast it.
static Tensor operand(const Tensor& x, const Tensor& out, DType dtype) {
  if (x.dtype() == dtype && (x.numel() == 1 || same_layout(x, out))) return x.detach();
  Tensor o = x.numel() == 1 ? empty({}, dtype) : empty_like(out, dtype);
  kernels::copy(x.numel() == 1 ? x.detach().view({}) : x.detach().expand(out.shape()), o);
  return o;
}

static DType float_type(DType d) { return is_floating(d) ? d : DType::Float32; }

// ---- element-wise ----

static Tensor binary_op(OpKind kind, Binary kop, const Tensor& a, const Tensor& b, double alpha = 1.0) {
  OpScope s(kind, {a, b});
  const Tensor &x = s[0], &y = s[1];
  DType dt = result_type({x, y});
  if (kind == OpKind::Div) dt = float_type(dt);
  const Shape shape = broadcast_shapes(x.shape(), y.shape(), op_name(kind));
  Tensor out = empty_strided(shape, result_strides({x, y}, shape), dt);
  kernels::binary(kop, operand(x, out, dt), operand(y, out, dt), out, alpha);
  std::vector<Tensor> saved;
  if (kind == OpKind::Mul || kind == OpKind::Div) saved = {x, y};
  record(kind, {x, y}, out, saved, op_params::Scalar{alpha});
  return s.done(out);
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return binary_op(OpKind::Add, Binary::Add, a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return binary_op(OpKind::Sub, Binary::Sub, a, b, alpha); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(OpKind::Mul, Binary::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(OpKind::Div, Binary::Div, a, b); }

// An op with one tensor input computed by a unary kernel with up to two scalars. `to_float` promotes integer
// inputs to float32.
static Tensor unary_op(OpKind kind, Unary kop, const Tensor& a, bool to_float, OpParams params = {},
                       bool save_out = false, double s0 = 0.0, double s1 = 0.0) {
  OpScope s(kind, {a});
  const Tensor& x = s[0];
  const DType dt = to_float ? float_type(x.dtype()) : x.dtype();
  Tensor out = empty_like(x, dt);
  kernels::unary(kop, operand(x, out, dt), out, s0, s1);
  record(kind, {x}, out, {save_out ? out.detach() : x}, std::move(params));
  return s.done(out);
}

// Scalar add/mul keep the tensor's dtype (integers become float32 for a non-integral scalar), and the
// scalar stays in the compute type, like PyTorch's wrapped numbers.
Tensor add(const Tensor& a, double b) {
  const bool integral = b == std::floor(b);
  return unary_op(OpKind::Add, Unary::AddScalar, a, !integral, op_params::Scalar{b}, false, b);
}
Tensor mul(const Tensor& a, double b) {
  const bool integral = b == std::floor(b);
  return unary_op(OpKind::Mul, Unary::MulScalar, a, !integral, op_params::Scalar{b}, false, b);
}
Tensor neg(const Tensor& a) { return unary_op(OpKind::Neg, Unary::Neg, a, false); }
Tensor pow(const Tensor& a, double e) {
  return unary_op(OpKind::Pow, Unary::Pow, a, true, op_params::Scalar{e}, false, e);
}
Tensor exp(const Tensor& a) { return unary_op(OpKind::Exp, Unary::Exp, a, true, {}, /*save_out=*/true); }
Tensor log(const Tensor& a) { return unary_op(OpKind::Log, Unary::Log, a, true); }
Tensor sqrt(const Tensor& a) { return unary_op(OpKind::Sqrt, Unary::Sqrt, a, true, {}, /*save_out=*/true); }
Tensor abs(const Tensor& a) { return unary_op(OpKind::Abs, Unary::Abs, a, false); }
Tensor relu(const Tensor& a) { return unary_op(OpKind::Relu, Unary::Relu, a, false); }
Tensor sigmoid(const Tensor& a) {
  return unary_op(OpKind::Sigmoid, Unary::Sigmoid, a, true, {}, /*save_out=*/true);
}
Tensor tanh(const Tensor& a) { return unary_op(OpKind::Tanh, Unary::Tanh, a, true, {}, /*save_out=*/true); }
Tensor gelu(const Tensor& a, bool tanh_approximate) { return OpDef<OpKind::Gelu>::forward(a, tanh_approximate); }
Tensor silu(const Tensor& a) { return OpDef<OpKind::Silu>::forward(a); }
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  const op_params::Clamp c{lo.value_or(-std::numeric_limits<double>::infinity()),
                           hi.value_or(std::numeric_limits<double>::infinity())};
  return unary_op(OpKind::Clamp, Unary::Clamp, a, false, c, false, c.min, c.max);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  CASTOR_CHECK(cond.dtype() == DType::Bool, "where: the condition must be bool, got ", cond.describe());
  OpScope s(OpKind::Where, {a, b});
  const Tensor &x = s[0], &y = s[1];
  const DType dt = result_type({x, y});
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(x.shape(), y.shape(), "where"), "where");
  Tensor out = empty(shape, dt);
  auto full_operand = [&](const Tensor& t, DType d) {
    Tensor o = operand(t, out, d);
    return o.numel() == out.numel() ? o : operand(o.expand(shape), out, d);
  };
  Tensor c = full_operand(cond, DType::Bool);
  kernels::where(c, full_operand(x, dt), full_operand(y, dt), out);
  record(OpKind::Where, {x, y}, out, {c});
  return s.done(out);
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  CASTOR_CHECK(mask.dtype() == DType::Bool, "masked_fill: the mask must be bool, got ", mask.describe());
  OpScope s(OpKind::MaskedFill, {a});
  const Tensor& x = s[0];
  Tensor out = where(mask, scalar_tensor(value, x.dtype()), x);
  CASTOR_CHECK(out.shape() == x.shape(), "masked_fill: mask ", mask.describe(), " does not broadcast to ",
               x.describe());
  return s.done(out);
}

static Tensor compare(kernels::Compare op, const Tensor& a, const Tensor& b) {
  const DType dt = result_type({a, b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "comparison");
  Tensor out = empty(shape, DType::Bool);
  kernels::compare(op, operand(a, out, dt), operand(b, out, dt), out);
  return out;
}
Tensor eq(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(kernels::Compare::Ge, a, b); }

bool isfinite_all(const Tensor& a) { return kernels::all_finite(a); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CASTOR_CHECK(a.shape() == b.shape(), "allclose: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i]) || std::abs(x[i] - y[i]) > atol + rtol * std::abs(y[i])) return false;
  }
  return true;
}

// ---- reductions ----

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

Tensor sum_like(OpKind kind, const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  OpScope s(kind, {a});
  const Tensor& x = s[0];
  const Reduction r = plan_reduction(x, dims, keepdim, op_name(kind));
  DType dt = dtype.value_or(is_floating(x.dtype()) ? x.dtype() : DType::Int64);
  if (kind == OpKind::Mean) {
    CASTOR_CHECK(is_floating(dt), "mean: needs a floating dtype, got ", dtype_name(dt));
  }
  Tensor out = empty(r.out_shape, dt);
  if (r.dims.empty() && x.dim() > 0) {
    kernels::copy(x.detach(), out);
  } else {
    kernels::sum_dim(reduction_input(x, r), r.outer, r.n, r.inner, out);
    if (kind == OpKind::Mean) {
      kernels::unary(Unary::MulScalar, out, out, 1.0 / static_cast<double>(r.n));
    }
  }
  record(kind, {x}, out, {}, op_params::Reduce{keepdim, r.dims, static_cast<double>(r.n)});
  return s.done(out);
}

}  // namespace

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  return sum_like(OpKind::Sum, a, dims, keepdim, dtype);
}
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  return sum_like(OpKind::Mean, a, dims, keepdim, dtype);
}

static std::pair<Tensor, Tensor> extreme(const Tensor& a, int64_t dim, bool keepdim, bool is_max) {
  const OpKind kind = is_max ? OpKind::MaxDim : OpKind::MinDim;
  OpScope s(kind, {a});
  const Tensor& x = s[0];
  const Reduction r = plan_reduction(x, {dim}, keepdim, op_name(kind));
  Tensor values = empty(r.out_shape, x.dtype()), indices = empty(r.out_shape, DType::Int64);
  kernels::extreme_dim(reduction_input(x, r), r.outer, r.n, r.inner, is_max, values, indices);
  record(kind, {x}, values, {indices}, op_params::Dim{r.dims[0], keepdim});
  return {s.done(values), indices};
}
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) { return extreme(a, dim, keepdim, true); }
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) { return extreme(a, dim, keepdim, false); }
Tensor max(const Tensor& a) { return extreme(a.detach().reshape({-1}), 0, false, true).first; }
Tensor min(const Tensor& a) { return extreme(a.detach().reshape({-1}), 0, false, false).first; }
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) { return extreme(a.detach(), dim, keepdim, true).second; }

static Tensor softmax_like(OpKind kind, const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  OpScope s(kind, {a});
  const Tensor& x = s[0];
  CASTOR_CHECK(is_floating(x.dtype()), op_name(kind), ": needs a floating-point input, got ", x.describe());
  const Reduction r = plan_reduction(x, {dim}, true, op_name(kind));
  Tensor out = empty(x.shape(), dtype.value_or(x.dtype()));
  kernels::softmax_dim(x.detach().contiguous(), r.outer, r.n, r.inner, kind == OpKind::LogSoftmax, out);
  record(kind, {x}, out, {out.detach()}, op_params::Dim{r.dims[0]});
  return s.done(out);
}
Tensor softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return softmax_like(OpKind::Softmax, a, dim, dtype);
}
Tensor log_softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return softmax_like(OpKind::LogSoftmax, a, dim, dtype);
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
