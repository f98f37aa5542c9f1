// Synchronised batch normalisation: the training statistics of the global batch, all-reduced in float32.
#include "castor/autograd.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/ops.h"

namespace castor::F {

namespace {

// y = the sum of x over ranks; its gradient is the sum of y's gradients over ranks (the adjoint of a sum-reduce).
struct AllReduceSum : autograd::Function<AllReduceSum> {
  static Tensor forward(autograd::FunctionCtx&, const std::vector<Tensor>& in) {
    Tensor y = in[0].contiguous().clone();
    dist::all_reduce(y);
    return y;
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx&, const Tensor& grad) {
    Tensor g = grad.contiguous().clone();
    dist::all_reduce(g);
    return {g};
  }
};

}  // namespace

Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, double momentum, double eps) {
  CASTOR_CHECK(input.dim() == 4, "sync_batch_norm: expected a 4-d (N, C, H, W) input, got ", input.describe());
  const int64_t C = input.size(1);
  const Tensor x = input.to(DType::Float32);  // (N, C, H, W)
  const double local_count = static_cast<double>(input.numel() / C);
  // Per channel: sum, sum of squares; then the element count, summed over ranks in one all-reduce.
  Tensor stats = cat({sum(x, {0, 2, 3}), sum(mul(x, x), {0, 2, 3}), full({1}, local_count)});  // (2C + 1)
  stats = AllReduceSum::apply({stats});
  const double count = stats.narrow(0, 2 * C, 1).item();
  CASTOR_CHECK(count > 1, "sync_batch_norm: expected more than one value per channel over all ranks, got ", count);
  const Tensor mean = mul(stats.narrow(0, 0, C), 1.0 / count);                       // (C)
  const Tensor var = sub(mul(stats.narrow(0, C, C), 1.0 / count), mul(mean, mean));  // (C), biased
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;  // (handles sharing the module's buffers)
    rm.mul_(1.0 - momentum).add_(mean.to(rm.dtype()), momentum);
    rv.mul_(1.0 - momentum).add_(mul(var, count / (count - 1)).to(rv.dtype()), momentum);
  }
  const Shape per_channel = {1, C, 1, 1};
  Tensor y = mul(sub(x, mean.view(per_channel)), pow(add(var, eps), -0.5).view(per_channel));
  if (weight.defined()) y = mul(y, weight.to(DType::Float32).view(per_channel));
  if (bias.defined()) y = add(y, bias.to(DType::Float32).view(per_channel));
  return y.to(input.dtype());
}

}  // namespace castor::F
