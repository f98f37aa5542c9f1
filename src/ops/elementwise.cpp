// The element-wise ops: PyTorch's type promotion and broadcasting, each op's forward (the public function) on the
// element-wise kernels beside its backward, the comparisons (not differentiable), and dtype casts.
#include "ops/elementwise.h"

#include <cmath>
#include <limits>
#include <optional>

#include "castor/ops.h"
#include "runtime/dispatch.h"

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

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
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

namespace {

// The strides of an element-wise result: those of the first operand of its shape that is dense, so that a
// channels-last input gives a channels-last result (as in PyTorch); contiguous ones otherwise.
Shape result_strides(const std::vector<Tensor>& operands, const Shape& shape) {
  for (const Tensor& t : operands)
    if (t.shape() == shape && t.is_dense()) return t.strides();
  return contiguous_strides(shape);
}

// x as a tensor of `dtype` laid out like `out` (same_layout), so that kernels run on flat arrays; a single element
// may stay single: kernels broadcast it.
Tensor operand(const Tensor& x, const Tensor& out, DType dtype) {
  if (x.dtype() == dtype && (x.numel() == 1 || same_layout(x, out))) return x.detach();
  Tensor o = x.numel() == 1 ? empty({}, dtype) : empty_like(out, dtype);
  kernels::copy(x.numel() == 1 ? x.detach().view({}) : x.detach().expand(out.shape()), o);
  return o;
}

DType float_type(DType d) { return is_floating(d) ? d : DType::Float32; }

// x op y broadcast, computed in `dtype` (16-bit in float32, rounded once).
Tensor map_binary(Binary op, const Tensor& x, const Tensor& y, DType dtype, const char* name, double alpha = 1.0) {
  const Shape shape = broadcast_shapes(x.shape(), y.shape(), name);
  Tensor out = empty_strided(shape, result_strides({x, y}, shape), dtype);
  kernels::binary(op, operand(x, out, dtype), operand(y, out, dtype), out, alpha);
  return out;
}

// op(x) with up to two scalars into a new tensor laid out as x; `to_float` computes integer inputs in float32.
Tensor map_unary(Unary op, const Tensor& x, bool to_float, double s0 = 0.0, double s1 = 0.0) {
  const DType dt = to_float ? float_type(x.dtype()) : x.dtype();
  Tensor out = empty_like(x, dt);
  kernels::unary(op, operand(x, out, dt), out, s0, s1);
  return out;
}

Tensor mask(const Tensor& cond, DType dtype) { return cond.to(dtype); }

}  // namespace

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

// ---- arithmetic ----

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  OpScope s(OpKind::Add, {a, b});
  Tensor out = map_binary(Binary::Add, s[0], s[1], result_type({s[0], s[1]}), "add", alpha);
  record_op<OpKind::Add>({s[0], s[1]}, out, {alpha}, {});
  return s.done(out);
}

// Scalar add/mul keep the tensor's dtype (integers become float32 for a non-integral scalar), and the scalar stays
// in the compute type, like PyTorch's wrapped numbers.
Tensor add(const Tensor& a, double b) {
  OpScope s(OpKind::Add, {a});
  Tensor out = map_unary(Unary::AddScalar, s[0], /*to_float=*/b != std::floor(b), b);
  record_op<OpKind::Add>({s[0]}, out, {b}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Add>::backward(const Node& node, const Params& p, const Saved&, Tensor g) {
  if (node.next.size() == 1) return {g};
  return {sum_to(g, node.input_shapes[0]), sum_to(p.alpha == 1.0 ? g : g * p.alpha, node.input_shapes[1])};
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  OpScope s(OpKind::Sub, {a, b});
  Tensor out = map_binary(Binary::Sub, s[0], s[1], result_type({s[0], s[1]}), "sub", alpha);
  record_op<OpKind::Sub>({s[0], s[1]}, out, {alpha}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Sub>::backward(const Node& node, const Params& p, const Saved&, Tensor g) {
  return {sum_to(g, node.input_shapes[0]), sum_to(g * -p.alpha, node.input_shapes[1])};
}

Tensor mul(const Tensor& a, const Tensor& b) {
  OpScope s(OpKind::Mul, {a, b});
  const Tensor &x = s[0], &y = s[1];
  Tensor out = map_binary(Binary::Mul, x, y, result_type({x, y}), "mul");
  record_op<OpKind::Mul>({x, y}, out, {}, {save(x), save(y)});
  return s.done(out);
}

Tensor mul(const Tensor& a, double b) {
  OpScope s(OpKind::Mul, {a});
  Tensor out = map_unary(Unary::MulScalar, s[0], /*to_float=*/b != std::floor(b), b);
  record_op<OpKind::Mul>({s[0]}, out, {b}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Mul>::backward(const Node& node, const Params& p, const Saved& s, Tensor g) {
  if (node.next.size() == 1) return {g * p.scalar};
  // Unpack only the saved tensor a gradient needs: the other may since have been changed in place (x.mul_(c)).
  return {node.next[0].valid() ? sum_to(g * node.unpack(s.b), node.input_shapes[0]) : Tensor(),
          node.next[1].valid() ? sum_to(g * node.unpack(s.a), node.input_shapes[1]) : Tensor()};
}

Tensor div(const Tensor& a, const Tensor& b) {
  OpScope s(OpKind::Div, {a, b});
  const Tensor &x = s[0], &y = s[1];
  Tensor out = map_binary(Binary::Div, x, y, float_type(result_type({x, y})), "div");
  record_op<OpKind::Div>({x, y}, out, {}, {save(x), save(y)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Div>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  // PyTorch's formulas and rounding order: grad / b and -grad * ((a / b) / b) (no b * b to overflow).
  const Tensor b = node.unpack(s.b);
  return {node.next[0].valid() ? sum_to(g / b, node.input_shapes[0]) : Tensor(),
          node.next[1].valid() ? sum_to(-g * ((node.unpack(s.a) / b) / b), node.input_shapes[1]) : Tensor()};
}

Tensor neg(const Tensor& a) {
  OpScope s(OpKind::Neg, {a});
  Tensor out = map_unary(Unary::Neg, s[0], false);
  record_op<OpKind::Neg>({s[0]}, out, {}, {});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Neg>::backward(const Node&, const Params&, const Saved&, Tensor g) { return {-g}; }

Tensor pow(const Tensor& a, double e) {
  OpScope s(OpKind::Pow, {a});
  Tensor out = map_unary(Unary::Pow, s[0], true, e);
  record_op<OpKind::Pow>({s[0]}, out, {e}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Pow>::backward(const Node& node, const Params& p, const Saved& s, Tensor g) {
  const double e = p.exponent;
  const Tensor x = node.unpack(s.src);
  return {e == 2.0 ? g * x * 2.0 : g * pow(x, e - 1.0) * e};
}

// ---- unary maps ----

Tensor exp(const Tensor& a) {
  OpScope s(OpKind::Exp, {a});
  Tensor out = map_unary(Unary::Exp, s[0], true);
  record_op<OpKind::Exp>({s[0]}, out, {}, {save_output(out)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Exp>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  return {g * node.unpack(s.dst)};
}

Tensor log(const Tensor& a) {
  OpScope s(OpKind::Log, {a});
  Tensor out = map_unary(Unary::Log, s[0], true);
  record_op<OpKind::Log>({s[0]}, out, {}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Log>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  return {g / node.unpack(s.src)};
}

Tensor sqrt(const Tensor& a) {
  OpScope s(OpKind::Sqrt, {a});
  Tensor out = map_unary(Unary::Sqrt, s[0], true);
  record_op<OpKind::Sqrt>({s[0]}, out, {}, {save_output(out)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Sqrt>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  return {g / (node.unpack(s.dst) * 2.0)};
}

Tensor abs(const Tensor& a) {
  OpScope s(OpKind::Abs, {a});
  Tensor out = map_unary(Unary::Abs, s[0], false);
  record_op<OpKind::Abs>({s[0]}, out, {}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Abs>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  const Tensor x = node.unpack(s.src);
  Tensor zero = zeros({}, x.dtype());
  return {g * (mask(gt(x, zero), g.dtype()) - mask(lt(x, zero), g.dtype()))};
}

Tensor relu(const Tensor& a) {
  OpScope s(OpKind::Relu, {a});
  Tensor out = map_unary(Unary::Relu, s[0], false);
  record_op<OpKind::Relu>({s[0]}, out, {}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Relu>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  const Tensor x = node.unpack(s.src);
  if (GradMode::is_enabled()) return {g * mask(gt(x, zeros({}, x.dtype())), g.dtype())};  // create_graph
  return {fused(Binary::ReluGrad, g, x)};
}

Tensor sigmoid(const Tensor& a) {
  OpScope s(OpKind::Sigmoid, {a});
  Tensor out = map_unary(Unary::Sigmoid, s[0], true);
  record_op<OpKind::Sigmoid>({s[0]}, out, {}, {save_output(out)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Sigmoid>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  const Tensor y = node.unpack(s.dst);
  if (GradMode::is_enabled()) return {g * y * (1.0 - y)};  // create_graph
  return {fused(Binary::SigmoidGrad, g, y)};
}

Tensor tanh(const Tensor& a) {
  OpScope s(OpKind::Tanh, {a});
  Tensor out = map_unary(Unary::Tanh, s[0], true);
  record_op<OpKind::Tanh>({s[0]}, out, {}, {save_output(out)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Tanh>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  const Tensor y = node.unpack(s.dst);
  if (GradMode::is_enabled()) return {g * (1.0 - y * y)};  // create_graph
  return {fused(Binary::TanhGrad, g, y)};
}

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  const OpDef<OpKind::Clamp>::Params c{lo.value_or(-std::numeric_limits<double>::infinity()),
                                       hi.value_or(std::numeric_limits<double>::infinity())};
  OpScope s(OpKind::Clamp, {a});
  Tensor out = map_unary(Unary::Clamp, s[0], false, c.min, c.max);
  record_op<OpKind::Clamp>({s[0]}, out, c, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Clamp>::backward(const Node& node, const Params& p, const Saved& s, Tensor g) {
  // PyTorch's where(min <= x <= max, g, 0): +0 outside, whatever g's sign.
  const Tensor x = node.unpack(s.src);
  Tensor zero = zeros({}, g.dtype());
  return {where(ge(x, scalar_tensor(p.min, DType::Float64)),
                where(le(x, scalar_tensor(p.max, DType::Float64)), g, zero), zero)};
}

// ---- selection ----

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  CASTOR_CHECK(cond.dtype() == DType::Bool, "where: the condition must be bool, got ", cond.describe());
  OpScope s(OpKind::Where, {a, b});
  const Tensor &x = s[0], &y = s[1];
  const DType dt = result_type({x, y});
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(x.shape(), y.shape(), "where"), "where");
  Tensor out = empty(shape, dt);
  auto full_operand = [&](const Tensor& t, DType d) {
    Tensor o = operand(t, out, d);
    return o.numel() == out.numel() ? o : operand(o.expand(shape), out, d);
  };
  Tensor c = full_operand(cond, DType::Bool);
  kernels::where(c, full_operand(x, dt), full_operand(y, dt), out);
  record_op<OpKind::Where>({x, y}, out, {}, {save(c)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Where>::backward(const Node& node, const Params&, const Saved& s, Tensor g) {
  const Tensor c = node.unpack(s.cond);
  Tensor zero = zeros({}, g.dtype());
  return {node.next[0].valid() ? sum_to(where(c, g, zero), node.input_shapes[0]) : Tensor(),
          node.next[1].valid() ? sum_to(where(c, zero, g), node.input_shapes[1]) : Tensor()};
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

// ---- comparisons ----

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

// ---- casts ----

Tensor Tensor::to(DType d) const {
  if (d == dtype()) return *this;
  Tensor out = empty_like(*this, d);
  kernels::copy(*this, out);
  if (is_floating(d)) record_op<OpKind::Cast>({*this}, out, {}, {});
  return out;
}

std::vector<Tensor> OpDef<OpKind::Cast>::backward(const Node&, const Params&, const Saved&, Tensor g) {
  return {g};  // the engine casts it back to the source dtype
}

}  // namespace castor
