// The helpers op definitions share (autograd/op_def.h): fused backward maps and the first-order check.
#include "autograd/op_def.h"

#include "castor/ops.h"

namespace castor {

Tensor fused(kernels::Binary op, const Tensor& g, const Tensor& x) {
  const Tensor xc = x.is_dense() ? x : x.contiguous();
  Tensor out = empty_like(xc), gc = g;
  if (g.dtype() != xc.dtype() || !same_layout(g, xc)) {
    gc = empty_like(xc);
    kernels::copy(g, gc);
  }
  kernels::binary(op, gc, xc, out);
  return out;
}

void check_first_order(const Node& node) {
  CASTOR_CHECK(!GradMode::is_enabled(), op_name(node.op), ": double backward is not supported");
}

}  // namespace castor
