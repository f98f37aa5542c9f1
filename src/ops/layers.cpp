// conv2d, its fusion with pooling and ReLU, batch norm and pooling: each op's forward (its F:: function) beside its
// backward on the layer kernels; gradients come back in the dtype the forward ran in.
#include "ops/layers.h"

#include "castor/functional.h"
#include "castor/ops.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {

std::string pair_str(std::array<int64_t, 2> v) { return detail::cat("(", v[0], ", ", v[1], ")"); }

// The output size of a convolution or pooling along one dim (PyTorch's floor formula).
int64_t out_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// t without history, laid out as `format` (an undefined t stays undefined).
Tensor detached(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous) {
  return t.defined() ? t.detach().contiguous(format) : t;
}

void check_floating(const char* op, const Tensor& t) {
  CASTOR_CHECK(is_floating(t.dtype()), op, ": expected a floating-point input, got ", t.describe());
}

// The incoming gradient in the dtype the forward ran in, laid out as its output was.
Tensor grad_in(const Tensor& grad, DType dtype, MemoryFormat format) {
  return (grad.dtype() == dtype ? grad : grad.to(dtype)).contiguous(format);
}

Tensor wanted(const Node& node, size_t input, DType dtype, MemoryFormat format = MemoryFormat::Contiguous) {
  return node.next[input].valid() ? empty(node.input_shapes[input], dtype, format) : Tensor();
}

// ---- convolution ----

// Checks a convolution's operands (op names it in errors) and gives its parameters and output shape.
kernels::Conv2dParams conv_params(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                                  std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                                  std::array<int64_t, 2> dilation, int64_t groups, Shape& out_shape) {
  CASTOR_CHECK(x.dim() == 4 && w.dim() == 4, op,
               ": expected a 4-D (N, C, H, W) input and (O, C/groups, kh, kw) "
               "weight, got ",
               x.describe(), " and ", w.describe());
  check_floating(op, x);
  CASTOR_CHECK(w.dtype() == x.dtype() && (!b.defined() || b.dtype() == x.dtype()), op, ": input ", x.describe(),
               ", weight ", w.describe(), " and bias ", b.defined() ? b.describe() : "(none)",
               " must have the same dtype");
  const int64_t c = x.size(1), o = w.size(0);
  CASTOR_CHECK(groups >= 1 && c % groups == 0 && o % groups == 0 && w.size(1) * groups == c, op, ": input ",
               x.describe(), " with ", c, " channels does not fit weight ", w.describe(), " with groups ", groups);
  CASTOR_CHECK(!b.defined() || b.shape() == Shape{o}, op, ": expected a bias of shape (", o, "), got ", b.describe());
  kernels::Conv2dParams p{};
  p.groups = groups;
  out_shape = {x.size(0), o, 0, 0};
  for (int i = 0; i < 2; ++i) {
    CASTOR_CHECK(stride[i] > 0 && dilation[i] > 0 && padding[i] >= 0, op, ": stride ", pair_str(stride),
                 " and dilation ", pair_str(dilation), " must be positive and padding ", pair_str(padding),
                 " non-negative");
    out_shape[2 + i] = out_size(x.size(2 + i), w.size(2 + i), stride[i], padding[i], dilation[i]);
    CASTOR_CHECK(out_shape[2 + i] > 0, op, ": input ", x.describe(), " padded by ", pair_str(padding),
                 " is smaller than the dilated kernel of weight ", w.describe(), " (dilation ", pair_str(dilation),
                 ")");
    p.stride[i] = stride[i], p.padding[i] = padding[i], p.dilation[i] = dilation[i];
  }
  return p;
}

std::vector<Tensor> conv_inputs(const Tensor& x, const Tensor& w, const Tensor& b) {
  std::vector<Tensor> inputs = {x, w};
  if (b.defined()) inputs.push_back(b);
  return inputs;
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

// ---- pooling ----

// Pooling's parameters and output shape for an input of `in` (N, C, H, W); a stride of {0, 0} is the kernel.
kernels::Pool2dParams pool_params(OpKind kind, const Shape& in, std::array<int64_t, 2> kernel,
                                  std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, Shape& out_shape) {
  const char* op = op_name(kind);
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  kernels::Pool2dParams p{};
  p.is_max = kind != OpKind::AvgPool2d;
  out_shape = {in[0], in[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    CASTOR_CHECK(kernel[i] > 0 && stride[i] > 0 && padding[i] >= 0, op, ": kernel ", pair_str(kernel), ", stride ",
                 pair_str(stride), " and padding ", pair_str(padding), " must be positive (padding non-negative)");
    CASTOR_CHECK(padding[i] <= kernel[i] / 2, op, ": padding ", pair_str(padding),
                 " should be at most half of the kernel ", pair_str(kernel));
    out_shape[2 + i] = out_size(in[2 + i], kernel[i], stride[i], padding[i], 1);
    CASTOR_CHECK(out_shape[2 + i] > 0, op, ": the output of ", shape_str(in), " with kernel ", pair_str(kernel),
                 ", stride ", pair_str(stride), " and padding ", pair_str(padding), " would be empty");
    p.kernel[i] = kernel[i], p.stride[i] = stride[i], p.padding[i] = padding[i];
  }
  return p;
}

// Max (K = MaxPool2d) or average pooling; `relu` (max pooling only): relu of the result, folded into the kernel
// where it can be (F::max_pool2d_relu).
template <OpKind K>
Tensor pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, bool count_include_pad, bool relu) {
  const char* op = op_name(K);
  OpScope s(K, {input});
  const Tensor& x = s[0];
  CASTOR_CHECK(x.dim() == 4, op, ": expected a 4-D (N, C, H, W) input, got ", x.describe());
  check_floating(op, x);
  Shape out_shape;
  kernels::Pool2dParams p = pool_params(K, x.shape(), kernel, stride, padding, out_shape);
  p.count_include_pad = count_include_pad;
  const MemoryFormat format = kernels::layer_format(x);
  p.relu = relu && format == MemoryFormat::ChannelsLast;
  p.relu = p.relu && kernels::max_pool2d_nhwc_fits(p);  // asked with relu set: its window limit is one lower
  Tensor out = empty(out_shape, x.dtype(), format);
  Tensor workspace = kernels::pool2d_forward(detached(x, format), out, p);
  if constexpr (K == OpKind::MaxPool2d)
    record_op<K>({x}, out, {p, format}, {save(workspace)});
  else
    record_op<K>({x}, out, {p, format}, {});
  out = s.done(out);
  return relu && !p.relu ? castor::relu(out) : out;
}

// The input gradient of a pooling node (workspace: max pooling's, else undefined).
std::vector<Tensor> pool2d_backward(const Node& node, const kernels::Pool2dParams& p, MemoryFormat format,
                                    const Tensor& workspace, const Tensor& diff_dst) {
  check_first_order(node);
  Tensor diff_src = empty(node.input_shapes[0], node.out_dtype, format);
  kernels::pool2d_backward(grad_in(diff_dst, node.out_dtype, format), workspace, diff_src, p);
  return {diff_src};
}

}  // namespace

Tensor F::conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  OpScope s(OpKind::Conv2d, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  Shape out_shape;
  const kernels::Conv2dParams p = conv_params("conv2d", x, w, b, stride, padding, dilation, groups, out_shape);
  const MemoryFormat format = kernels::layer_format(x);
  Tensor out = empty(out_shape, x.dtype(), format);
  const Tensor xc = detached(x, format), wc = detached(w);
  kernels::conv2d_forward(xc, wc, detached(b), out, p);
  record_op<OpKind::Conv2d>(conv_inputs(x, w, b), out, {p}, {save(xc), save(wc)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Conv2d>::backward(const Node& node, const Params& p, const Saved& s,
                                                    Tensor diff_dst) {
  check_first_order(node);
  const Tensor src = node.unpack(s.src);
  return conv2d_grads(node, src, node.unpack(s.weights), grad_in(diff_dst, node.out_dtype, kernels::layer_format(src)),
                      p.conv);
}

Tensor F::conv2d_max_pool2d_relu(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                 std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                                 std::array<int64_t, 2> pool_kernel) {
  OpScope s(OpKind::Conv2dMaxPool2dRelu, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  const char* op = op_name(OpKind::Conv2dMaxPool2dRelu);
  Shape conv_shape, out_shape;
  const kernels::Conv2dParams cp = conv_params(op, x, w, b, stride, padding, {1, 1}, 1, conv_shape);
  kernels::Pool2dParams pp = pool_params(OpKind::Conv2dMaxPool2dRelu, conv_shape, pool_kernel, pool_kernel, {0, 0},
                                         out_shape);
  pp.relu = true;
  // A one-channel input is laid out alike in both formats (a model's grayscale batch): it takes the fused,
  // channels-last path too, which keeps the network after it channels-last.
  const bool one_channel = x.size(1) == 1 && x.is_contiguous(MemoryFormat::ChannelsLast);
  const MemoryFormat format = one_channel ? MemoryFormat::ChannelsLast : kernels::layer_format(x);
  if (format != MemoryFormat::ChannelsLast || x.dtype() == DType::Float64 || !kernels::max_pool2d_nhwc_fits(pp)) {
    return s.done(F::max_pool2d_relu(F::conv2d(x, w, b, stride, padding), pool_kernel));  // the two ops, unfused
  }
  Tensor out = empty(out_shape, x.dtype(), format);
  const Tensor workspace = empty({out_shape[0], out_shape[2], out_shape[3], out_shape[1]}, DType::UInt8);
  const Tensor xc = detached(x, format), wc = detached(w);
  kernels::conv2d_max_pool_relu_forward(xc, wc, detached(b), out, workspace, conv_shape, cp, pp);
  record_op<OpKind::Conv2dMaxPool2dRelu>(conv_inputs(x, w, b), out, {cp, conv_shape, pp},
                                         {save(xc), save(wc), save(workspace)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::Conv2dMaxPool2dRelu>::backward(const Node& node, const Params& p, const Saved& s,
                                                                 Tensor diff_dst) {
  check_first_order(node);
  const Tensor diff_conv = empty(p.conv_shape, node.out_dtype, MemoryFormat::ChannelsLast);
  kernels::pool2d_backward(grad_in(diff_dst, node.out_dtype, MemoryFormat::ChannelsLast), node.unpack(s.workspace),
                           diff_conv, p.pool);
  diff_dst = Tensor();  // not needed by the convolution's backward, which holds the step's peak: freed first
  return conv2d_grads(node, node.unpack(s.src), node.unpack(s.weights), diff_conv, p.conv);
}

Tensor F::batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, bool training, double momentum, double eps) {
  OpScope s(OpKind::BatchNorm, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  CASTOR_CHECK(x.dim() == 2 || x.dim() == 4, "batch_norm: expected a (N, C) or (N, C, H, W) input, got ", x.describe());
  check_floating("batch_norm", x);
  const int64_t c = x.size(1), count = x.numel() / c;
  for (const Tensor* t : {&w, &b, &running_mean, &running_var})
    CASTOR_CHECK(!t->defined() || t->shape() == Shape{c}, "batch_norm: expected per-channel tensors of shape (", c,
                 ") for input ", x.describe(), ", got ", t->describe());
  CASTOR_CHECK(training || (running_mean.defined() && running_var.defined()),
               "batch_norm: evaluation needs running_mean and running_var");
  CASTOR_CHECK(!training || count > 1, "batch_norm: expected more than 1 value per channel when training, got input ",
               x.describe());
  // Statistics, scale and shift are float32 (float64 for a float64 input).
  const DType stat_dtype = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  auto stat = [&](const Tensor& t) { return t.defined() ? t.detach().to(stat_dtype).contiguous() : t; };
  const Shape shape4 = x.dim() == 4 ? x.shape() : Shape{x.size(0), c, 1, 1};
  const MemoryFormat format = kernels::layer_format(x);
  const Tensor src = detached(x, format).view(shape4), scale = stat(w), shift = stat(b);
  // The kernel writes the batch statistics when training; in evaluation it reads copies of the running ones, so
  // that later updates of the running statistics leave the saved values intact.
  Tensor mean = training ? empty({c}, stat_dtype) : stat(running_mean).clone();
  Tensor var = training ? empty({c}, stat_dtype) : stat(running_var).clone();
  Tensor out = empty(x.shape(), x.dtype(), format);
  kernels::batch_norm_forward(src, scale, shift, mean, var, out.view(shape4), eps, training);
  if (training && running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;
    rm.mul_(1.0 - momentum).add_(mean.to(rm.dtype()), momentum);
    rv.mul_(1.0 - momentum).add_(var.to(rv.dtype()), momentum * count / (count - 1.0));  // unbiased, as PyTorch
  }
  std::vector<Tensor> inputs = {x};
  if (w.defined()) inputs.push_back(w);
  if (b.defined()) inputs.push_back(b);
  record_op<OpKind::BatchNorm>(inputs, out, {training, eps},
                               {save(src), save(mean), save(var), save(scale), save(shift)});
  return s.done(out);
}

std::vector<Tensor> OpDef<OpKind::BatchNorm>::backward(const Node& node, const Params& p, const Saved& s,
                                                       Tensor diff_dst) {
  check_first_order(node);
  const Tensor src = node.unpack(s.src), mean = node.unpack(s.mean), var = node.unpack(s.var);
  const Tensor scale = node.unpack(s.scale), shift = node.unpack(s.shift);
  const bool has_weight = scale.defined(), has_bias = shift.defined();
  const int64_t c = src.size(1);
  const MemoryFormat format = kernels::layer_format(src);
  Tensor diff_src = empty(src.shape(), node.out_dtype, format);
  Tensor diff_scale = has_weight && node.next[1].valid() ? empty({c}, mean.dtype()) : Tensor();
  Tensor diff_shift = has_bias && node.next.back().valid() ? empty({c}, mean.dtype()) : Tensor();
  kernels::batch_norm_backward(src, grad_in(diff_dst, node.out_dtype, format).view(src.shape()), scale, shift, mean,
                               var, diff_src, diff_scale, diff_shift, p.eps, p.training);
  std::vector<Tensor> grads = {diff_src.view(node.input_shapes[0])};
  if (has_weight) grads.push_back(diff_scale);
  if (has_bias) grads.push_back(diff_shift);
  return grads;
}

Tensor F::max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding) {
  return pool2d<OpKind::MaxPool2d>(input, kernel, stride, padding, false, /*relu=*/false);
}

Tensor F::max_pool2d_relu(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                          std::array<int64_t, 2> padding) {
  return pool2d<OpKind::MaxPool2d>(input, kernel, stride, padding, false, /*relu=*/true);
}

std::vector<Tensor> OpDef<OpKind::MaxPool2d>::backward(const Node& node, const Params& p, const Saved& s,
                                                       Tensor diff_dst) {
  return pool2d_backward(node, p.pool, p.format, node.unpack(s.workspace), diff_dst);
}

Tensor F::avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding, bool count_include_pad) {
  return pool2d<OpKind::AvgPool2d>(input, kernel, stride, padding, count_include_pad, /*relu=*/false);
}

std::vector<Tensor> OpDef<OpKind::AvgPool2d>::backward(const Node& node, const Params& p, const Saved&,
                                                       Tensor diff_dst) {
  return pool2d_backward(node, p.pool, p.format, Tensor(), diff_dst);
}

}  // namespace castor
