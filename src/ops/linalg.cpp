// mm, bmm, addmm and matmul: forwards on the matmul kernel (addmm with its bias) and the product gradient rule they
// share.
#include "ops/linalg.h"

#include "castor/ops.h"
#include "ops/elementwise.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {

void check_matmul_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  CASTOR_CHECK(a.dtype() == b.dtype(), op, ": expected both operands to have the same dtype, got ", a.describe(),
               " and ", b.describe());
  CASTOR_CHECK(is_floating(a.dtype()), op, ": needs floating-point operands, got ", a.describe());
}

// The gradients of a product node whose saved operands are a and b (inputs 0 and 1).
std::vector<Tensor> product_backward(const Node& node, const SavedTensor& a, const SavedTensor& b,
                                     const Tensor& diff_dst) {
  const bool need_a = node.next[0].valid(), need_b = node.next[1].valid();
  auto [diff_a, diff_b] = product_grads(need_b ? node.unpack(a) : Tensor(), node.unpack(b), diff_dst, need_a, need_b);
  return {diff_a, diff_b};
}

// mm on operands autocast by the caller's OpScope (mm's, or matmul's).
Tensor mm_impl(const Tensor& a, const Tensor& b) {
  CASTOR_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D operands, got ", a.describe(), " and ", b.describe());
  CASTOR_CHECK(a.size(1) == b.size(0), "mm: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
               " cannot be multiplied (", a.size(1), " != ", b.size(0), ")");
  check_matmul_dtypes("mm", a, b);
  Tensor out = empty({a.size(0), b.size(1)}, a.dtype());
  kernels::matmul(a.detach(), b.detach(), out);
  // a is read only for b's gradient: a product with a frozen weight (a LoRA base) keeps no input alive.
  record_op<OpKind::Mm>({a, b}, out, {}, {b.requires_grad() ? save(a) : SavedTensor{}, save(b)});
  return out;
}

// bmm on operands autocast by the caller's OpScope (bmm's, or matmul's).
Tensor bmm_impl(const Tensor& a, const Tensor& b) {
  CASTOR_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands, got ", a.describe(), " and ", b.describe());
  CASTOR_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "bmm: shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), " cannot be multiplied");
  check_matmul_dtypes("bmm", a, b);
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.dtype());
  kernels::matmul(a.detach(), b.detach(), out);
  record_op<OpKind::Bmm>({a, b}, out, {}, {save(a), save(b)});
  return out;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  OpScope s(OpKind::Mm, {a, b});
  return s.done(mm_impl(s[0], s[1]));
}

std::vector<Tensor> OpDef<OpKind::Mm>::backward(const Node& node, const Params&, const Saved& s, Tensor diff_dst) {
  return product_backward(node, s.a, s.b, diff_dst);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  OpScope s(OpKind::Bmm, {a, b});
  return s.done(bmm_impl(s[0], s[1]));
}

std::vector<Tensor> OpDef<OpKind::Bmm>::backward(const Node& node, const Params&, const Saved& s, Tensor diff_dst) {
  return product_backward(node, s.a, s.b, diff_dst);
}

Tensor addmm(const Tensor& bias_in, const Tensor& mat1, const Tensor& mat2) {
  OpScope s(OpKind::Addmm, {bias_in, mat1, mat2});
  const Tensor &bias = s[0], &a = s[1], &b = s[2];
  CASTOR_CHECK(a.dim() == 2 && b.dim() == 2, "addmm: expected 2-D matrices, got ", a.describe(), " and ",
               b.describe());
  CASTOR_CHECK(a.size(1) == b.size(0), "addmm: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
               " cannot be multiplied (", a.size(1), " != ", b.size(0), ")");
  CASTOR_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1), "addmm: expected a 1-D input of ", b.size(1),
               " elements (added to every row of the product), got ", bias.describe());
  CASTOR_CHECK(is_floating(a.dtype()) && b.dtype() == a.dtype() && bias.dtype() == a.dtype(),
               "addmm: expected floating-point operands of one dtype, got ", bias.describe(), ", ", a.describe(),
               " and ", b.describe());
  Tensor out = empty({a.size(0), b.size(1)}, a.dtype());
  kernels::matmul(a.detach(), b.detach(), out, bias.detach().contiguous());
  record_op<OpKind::Addmm>({bias, a, b}, out, {}, {b.requires_grad() ? save(a) : SavedTensor{}, save(b)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Addmm>::backward(const Node& node, const Params&, const Saved& s, Tensor diff_dst) {
  const bool need_a = node.next[1].valid(), need_b = node.next[2].valid();
  auto [diff_a, diff_b] = product_grads(need_b ? node.unpack(s.mat1) : Tensor(),
                                        need_a || need_b ? node.unpack(s.mat2) : Tensor(), diff_dst, need_a, need_b);
  return {node.next[0].valid() ? sum_to(diff_dst, node.input_shapes[0]) : Tensor(), diff_a, diff_b};
}

// Recorded as the mm or bmm it runs (composite: the Matmul row's OpScope only).
Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  OpScope s(OpKind::Matmul, {a_in, b_in});
  const Tensor &a = s[0], &b = s[1];
  CASTOR_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got ", a.describe(), " and ",
               b.describe());
  if (a.dim() <= 2 && b.dim() <= 2) {
    Tensor x = a.dim() == 1 ? a.unsqueeze(0) : a, y = b.dim() == 1 ? b.unsqueeze(1) : b;
    Tensor out = mm_impl(x, y);
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
  Tensor out = bmm_impl(x.expand(xs).reshape({nb, M, K}), y.expand(ys).reshape({nb, K, N}));
  Shape os = batch;
  if (a.dim() > 1) os.push_back(M);
  if (b.dim() > 1) os.push_back(N);
  return s.done(out.view(os));
}

std::pair<Tensor, Tensor> product_grads(const Tensor& a, const Tensor& b, const Tensor& diff_dst, bool need_a,
                                        bool need_b) {
  const auto product = [](const Tensor& x, const Tensor& y) { return x.dim() == 2 ? mm(x, y) : bmm(x, y); };
  const bool b_transposed = b.dim() == 2 && !b.is_contiguous() && b.t().is_contiguous();
  const Tensor diff_a = need_a ? product(diff_dst, b.transpose(-2, -1)) : Tensor();
  const Tensor diff_b = !need_b      ? Tensor()
                        : b_transposed ? mm(diff_dst.t(), a).t()
                                       : product(a.transpose(-2, -1), diff_dst);
  return {diff_a, diff_b};
}

}  // namespace castor
