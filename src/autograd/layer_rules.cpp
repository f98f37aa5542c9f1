// Backward rules of the layer ops (conv2d, its fusion with pooling, batch_norm, pooling) on the layer kernels;
// gradients come back in the dtype the forward ran in. Each node's saved tensors are listed where they are recorded (src/nn/functional.cpp)
// and repeated here; its parameters are typed (autograd/node.h).
#include "autograd/layer_rules.h"

#include "castor/autograd.h"
#include "kernels/layers.h"

namespace castor::layer_rules {

namespace {

// The incoming gradient in the dtype the forward ran in, laid out as its output was.
Tensor grad_in(const Tensor& grad, DType dtype, MemoryFormat format) {
  return (grad.dtype() == dtype ? grad : grad.to(dtype)).contiguous(format);
}

void check_first_order(const Node& node) {
  CASTOR_CHECK(!GradMode::is_enabled(), op_name(node.op), ": double backward is not supported");
}

Tensor wanted(const Node& node, size_t input, DType dtype, MemoryFormat format = MemoryFormat::Contiguous) {
  return node.next[input].valid() ? empty(node.input_shapes[input], dtype, format) : Tensor();
}

// The gradients of a convolution's inputs {x, w[, b]} (those wanted) from diff_dst.
std::vector<Tensor> conv2d_grads(const Node& node, const Tensor& src, const Tensor& weights, const Tensor& diff_dst,
                                 const kernels::Conv2dParams& p) {
  const DType dt = node.out_dtype;
  const MemoryFormat format = kernels::layer_format(src);
  std::vector<Tensor> grads = {wanted(node, 0, dt, format), wanted(node, 1, dt)};
  if (node.next.size() == 3) grads.push_back(wanted(node, 2, dt));
  const Tensor diff_bias = grads.size() == 3 ? grads[2] : Tensor();
  kernels::conv2d_backward(src, weights, diff_dst, grads[0], grads[1], diff_bias, p);
  return grads;
}

}  // namespace

// Conv2d: inputs {x, w[, b]}; saved {src (laid out as the output), weights (contiguous)}. Backward-data is
// skipped when x needs no gradient (a network's first layer).
std::vector<Tensor> conv2d(const Node& node, const Tensor& grad) {
  check_first_order(node);
  const Tensor& src = node.saved_tensor(0);
  return conv2d_grads(node, src, node.saved_tensor(1),
                      grad_in(grad, node.out_dtype, kernels::layer_format(src)), node.param<kernels::Conv2dParams>());
}

// Conv2dMaxPool2dRelu: inputs {x, w[, b]}; saved {src (channels-last), weights, pooling's workspace}. The backward of
// the three ops on the whole batch: the pooling's (with the ReLU's folded in), then the convolution's.
std::vector<Tensor> conv2d_max_pool2d_relu(const Node& node, Tensor grad) {
  check_first_order(node);
  const auto& [conv, conv_shape, pool] = node.param<op_params::ConvPool>();
  const Tensor& src = node.saved_tensor(0);
  const Tensor diff_conv = empty(conv_shape, node.out_dtype, MemoryFormat::ChannelsLast);
  kernels::pool2d_backward(grad_in(grad, node.out_dtype, MemoryFormat::ChannelsLast), node.saved_tensor(2), diff_conv,
                           pool);
  grad = Tensor();  // not needed by the convolution's backward, which holds the step's peak: freed first
  return conv2d_grads(node, src, node.saved_tensor(1), diff_conv, conv);
}

// BatchNorm: inputs {x[, weight][, bias]}; saved {src (N, C, H, W, laid out as the output), mean, var[, scale][, shift]}, all but src float;
// the weight and bias gradients are float32 (float64 for a
// float64 input); the engine casts them to the parameters' dtypes.
std::vector<Tensor> batch_norm(const Node& node, const Tensor& grad) {
  check_first_order(node);
  const auto& [training, has_weight, has_bias, eps] = node.param<op_params::BatchNorm>();
  const Tensor& src = node.saved_tensor(0);
  const Tensor& mean = node.saved_tensor(1);
  const Tensor& var = node.saved_tensor(2);
  const Tensor scale = has_weight ? node.saved_tensor(3) : Tensor();
  const Tensor shift = has_bias ? node.saved_tensor(3 + has_weight) : Tensor();
  const DType stat_dtype = mean.dtype();
  const int64_t c = src.size(1);
  const MemoryFormat format = kernels::layer_format(src);
  Tensor diff_src = empty(src.shape(), node.out_dtype, format);
  Tensor diff_scale = has_weight && node.next[1].valid() ? empty({c}, stat_dtype) : Tensor();
  Tensor diff_shift = has_bias && node.next.back().valid() ? empty({c}, stat_dtype) : Tensor();
  kernels::batch_norm_backward(src, grad_in(grad, node.out_dtype, format).view(src.shape()), scale, shift, mean, var,
                               diff_src, diff_scale, diff_shift, eps, training);
  std::vector<Tensor> grads = {diff_src.view(node.input_shapes[0])};
  if (has_weight) grads.push_back(diff_scale);
  if (has_bias) grads.push_back(diff_shift);
  return grads;
}

namespace {

// MaxPool2d / AvgPool2d: input {x}; saved {workspace} for max pooling.
std::vector<Tensor> pool2d(const Node& node, const Tensor& grad) {
  check_first_order(node);
  const auto& [p, format] = node.param<op_params::Pool>();
  Tensor diff_src = empty(node.input_shapes[0], node.out_dtype, format);
  kernels::pool2d_backward(grad_in(grad, node.out_dtype, format), p.is_max ? node.saved_tensor(0) : Tensor(), diff_src, p);
  return {diff_src};
}

}  // namespace

std::vector<Tensor> max_pool2d(const Node& node, const Tensor& grad) { return pool2d(node, grad); }
std::vector<Tensor> avg_pool2d(const Node& node, const Tensor& grad) { return pool2d(node, grad); }

}  // namespace castor::layer_rules
