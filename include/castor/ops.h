// Tensor ops with PyTorch semantics: broadcasting, type promotion, autograd and autocast.
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "castor/tensor.h"

namespace castor {

// Element-wise, broadcasting, with PyTorch's type promotion (0-dim tensors and scalars do not widen a
// dimensioned tensor of the same category). 16-bit inputs are computed in float32 and rounded once.
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approximate = false);
Tensor silu(const Tensor& a);  // a * sigmoid(a)
Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// a with `value` where mask (bool, broadcastable to a) is true; no gradient flows there.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// Comparisons give bool tensors and are not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
bool isfinite_all(const Tensor& a);  // false if any element is inf or NaN
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// Reductions over `dims` ({} = all). 16-bit inputs accumulate in float32; the result has the input dtype
// unless `dtype` is given.
Tensor sum(const Tensor& a, const Shape& dims = {}, bool keepdim = false, std::optional<DType> dtype = {});
Tensor mean(const Tensor& a, const Shape& dims = {}, bool keepdim = false, std::optional<DType> dtype = {});
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);  // values, int64 indices
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& a);  // the maximum of all elements (not differentiable)
Tensor min(const Tensor& a);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype = {});
Tensor log_softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype = {});

// Matrix products: float32 and bfloat16 on oneDNN; float16 emulated (fp16 inputs, fp32 accumulation,
// one rounding). matmul follows torch.matmul's broadcasting of batch dims.
Tensor mm(const Tensor& a, const Tensor& b);   // (M, K) x (K, N)
Tensor bmm(const Tensor& a, const Tensor& b);  // (B, M, K) x (B, K, N)
Tensor matmul(const Tensor& a, const Tensor& b);
// input (N) + mat1 (M, K) x mat2 (K, N), rounded once (torch.addmm with beta = alpha = 1 and a 1-D input, the
// fused path of F::linear).
Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);  // index: int64

// Sums `grad` over broadcast dims so it has `shape` (the adjoint of expand).
Tensor sum_to(const Tensor& grad, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }

// The dtype PyTorch's result_type gives for these operands.
DType result_type(const std::vector<Tensor>& tensors);

}  // namespace castor
