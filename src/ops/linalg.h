// Matrix-product ops as typed definitions: mm, bmm and addmm (a bias plus a product, rounded once), sharing one
// product gradient rule. Their forwards are the public functions of castor/ops.h (matmul too, recorded as mm or
// bmm), defined beside these backwards in linalg.cpp.
#pragma once
#include "ops/op_def.h"

namespace castor {

// dst (M, N) = a (M, K) x b (K, N): float32 and bfloat16 on oneDNN, float16 emulated (fp32 accumulation, one
// rounding).
template <>
struct OpDef<OpKind::Mm> {
  struct Params {};
  struct Saved {
    SavedTensor a, b;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst (B, M, N) = a (B, M, K) x b (B, K, N).
template <>
struct OpDef<OpKind::Bmm> {
  struct Params {};
  struct Saved {
    SavedTensor a, b;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// dst (M, N) = bias (N) + mat1 (M, K) x mat2 (K, N), the sum rounded once to the operands' dtype (PyTorch's addmm
// with a 1-D input, beta = alpha = 1: linear's fused path); the bias gradient is diff_dst summed over rows.
template <>
struct OpDef<OpKind::Addmm> {
  struct Params {};
  struct Saved {
    SavedTensor mat1, mat2;
  };
  static std::vector<Tensor> backward(const Node& node, const Params& p, const Saved& s, Tensor diff_dst);
};

// The gradients of a (.., M, K) x b (.., K, N) given diff_dst (.., M, N), each only where `need` says: diff_a =
// diff_dst b^T, diff_b = a^T diff_dst. A transposed b (linear's weight.t()) gets its gradient in its own layout,
// (diff_dst^T a)^T, as PyTorch does: the weight's .grad is then the product itself, not a transposed copy.
std::pair<Tensor, Tensor> product_grads(const Tensor& a, const Tensor& b, const Tensor& diff_dst, bool need_a,
                                        bool need_b);

}  // namespace castor
