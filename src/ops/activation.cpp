// GELU and SiLU: forward on the element-wise kernels (16-bit computed in float32, rounded once) and their backward
// as fused maps of the saved input.
#include "ops/activation.h"

#include "castor/ops.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {

// op(x) into a new tensor laid out as x (dense) or contiguous; integers computed in float32.
Tensor map_unary(kernels::Unary op, const Tensor& x) {
  Tensor src = x.detach();
  if (!is_floating(src.dtype())) src = src.to(DType::Float32);
  if (!src.is_dense()) src = src.contiguous();
  Tensor dst = empty_like(src);
  kernels::unary(op, src, dst);
  return dst;
}

}  // namespace

Tensor gelu(const Tensor& input, bool tanh_approximate) {
  OpScope s(OpKind::Gelu, {input});
  Tensor out = map_unary(tanh_approximate ? kernels::Unary::GeluTanh : kernels::Unary::Gelu, s[0]);
  record_op<OpKind::Gelu>({s[0]}, out, {tanh_approximate}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Gelu>::backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst) {
  check_first_order(node);
  return {fused(p.tanh_approximate ? kernels::Binary::GeluTanhGrad : kernels::Binary::GeluGrad, diff_dst,
                node.unpack(s.src))};
}

Tensor silu(const Tensor& input) {
  OpScope s(OpKind::Silu, {input});
  Tensor out = map_unary(kernels::Unary::Silu, s[0]);
  record_op<OpKind::Silu>({s[0]}, out, {}, {save(s[0])});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Silu>::backward(const Node& node, const Params&, const Saved& s, Tensor diff_dst) {
  check_first_order(node);
  return {fused(kernels::Binary::SiluGrad, diff_dst, node.unpack(s.src))};
}

}  // namespace castor
