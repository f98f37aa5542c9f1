// torch.nn.functional for Castor: layers on the oneDNN / reference kernels with their autograd records, and the
// composites (linear, dropout, adaptive pooling, losses) built from differentiable ops.
#include "castor/functional.h"

#include <algorithm>
#include <cmath>

#include "autograd/defs/transformer.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "runtime/dispatch.h"
#include "kernels/layers.h"

namespace castor::F {

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

// `relu` (max pooling only): relu of the result, folded into the kernel where it can be (max_pool2d_relu).
Tensor pool2d(OpKind kind, const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, bool count_include_pad, bool relu = false) {
  const char* op = op_name(kind);
  OpScope s(kind, {input});
  const Tensor& x = s[0];
  CASTOR_CHECK(x.dim() == 4, op, ": expected a 4-D (N, C, H, W) input, got ", x.describe());
  check_floating(op, x);
  Shape out_shape;
  kernels::Pool2dParams p = pool_params(kind, x.shape(), kernel, stride, padding, out_shape);
  p.count_include_pad = count_include_pad;
  const MemoryFormat format = kernels::layer_format(x);
  p.relu = relu && format == MemoryFormat::ChannelsLast;
  p.relu = p.relu && kernels::max_pool2d_nhwc_fits(p);  // asked with relu set: its window limit is one lower
  Tensor out = empty(out_shape, x.dtype(), format);
  Tensor workspace = kernels::pool2d_forward(detached(x, format), out, p);
  // saved: max pooling's workspace (which, with the ReLU folded in, routes no gradient where the ReLU gives none).
  record(kind, {x}, out, p.is_max ? std::vector<Tensor>{workspace} : std::vector<Tensor>{},
         op_params::Pool{p, format});
  out = s.done(out);
  return relu && !p.relu ? F::relu(out) : out;
}

Tensor reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return mean(loss);
  }
  CASTOR_ASSERT(false, "unknown reduction");
}

// The per-sample pieces of a (weighted) negative log-likelihood over log_probs (N, C) and class indices (N).
struct Nll {
  Tensor loss;    // -w[t_i] * log_probs[i, t_i], 0 where t_i == ignore_index
  Tensor weight;  // w[t_i] (1 without class weights), 0 where ignored
  Tensor valid;   // 1, or 0 where ignored
};

Nll nll_terms(const char* op, const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
              const Tensor& weight) {
  CASTOR_CHECK(log_probs.dim() == 2, op, ": expected (N, C) scores, got ", log_probs.describe());
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  CASTOR_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == n, op,
               ": expected int64 class indices of shape (", n, "), got ", target.describe());
  CASTOR_CHECK(!weight.defined() || weight.shape() == Shape{c}, op, ": expected class weights of shape (", c,
               "), got ", weight.describe());
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  std::vector<double> safe(n), valid(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = t[i] == ignore_index;
    CASTOR_CHECK(ignored || (t[i] >= 0 && t[i] < c), op, ": target ", t[i], " of sample ", i,
                 " is out of bounds for ", c, " classes");
    safe[i] = ignored ? 0 : static_cast<double>(t[i]);
    valid[i] = ignored ? 0 : 1;
  }
  const Tensor index = tensor(safe, {n}, DType::Int64);
  Nll r;
  r.valid = tensor(valid, {n}, log_probs.dtype());
  r.weight = weight.defined() ? gather(weight, 0, index) * r.valid : r.valid;
  r.loss = -(gather(log_probs, 1, index.view({n, 1})).view({n}) * r.weight);
  return r;
}

// PyTorch's weighted mean: the sum of the losses over the sum of the weights of the counted samples.
Tensor reduce_weighted(const Nll& nll, Reduction reduction) {
  if (reduction == Reduction::Mean) return sum(nll.loss) / sum(nll.weight);
  return reduce(nll.loss, reduction);
}

void check_same_shape(const char* op, const Tensor& input, const Tensor& target) {
  CASTOR_CHECK(input.shape() == target.shape(), op, ": target ", target.describe(), " must have the shape of input ",
               input.describe());
}

}  // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  OpScope s(OpKind::Linear, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  CASTOR_CHECK(w.dim() == 2, "linear: expected a 2-D (out, in) weight, got ", w.describe());
  CASTOR_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input ", x.describe(), " does not match weight ",
               w.describe(), " (", x.dim() >= 1 ? x.size(-1) : 0, " != ", w.size(1), " features)");
  CASTOR_CHECK(!b.defined() || b.shape() == Shape{w.size(0)}, "linear: expected a bias of shape (", w.size(0),
               "), got ", b.describe());
  Shape shape = x.shape();
  shape.back() = w.size(0);
  // PyTorch 1.13's linear: a 2-D input, or a contiguous 3-D one as rows, with a bias is one addmm (the bias added
  // before the one rounding: 16-bit outputs match it bit for bit); other inputs take a product and an add.
  if (b.defined() && (x.dim() == 2 || (x.dim() == 3 && x.is_contiguous())))
    return s.done(addmm(b, x.reshape({-1, x.size(-1)}), w.t()).view(shape));
  if (x.dim() > 2) {  // (*, in) as rows: one GEMM against the weight, not a batch of copies of it
    Tensor out = mm(x.reshape({-1, x.size(-1)}), w.t());
    return s.done((b.defined() ? add(out, b) : out).view(shape));
  }
  Tensor out = matmul(x, w.t());
  return s.done(b.defined() ? add(out, b) : out);
}

namespace {

// Checks a convolution's operands (op names it in errors) and gives its parameters and output shape.
kernels::Conv2dParams conv_params(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                                  std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                                  std::array<int64_t, 2> dilation, int64_t groups, Shape& out_shape) {
  CASTOR_CHECK(x.dim() == 4 && w.dim() == 4, op, ": expected a 4-D (N, C, H, W) input and (O, C/groups, kh, kw) "
               "weight, got ", x.describe(), " and ", w.describe());
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

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  OpScope s(OpKind::Conv2d, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  Shape out_shape;
  const kernels::Conv2dParams p = conv_params("conv2d", x, w, b, stride, padding, dilation, groups, out_shape);
  const MemoryFormat format = kernels::layer_format(x);
  Tensor out = empty(out_shape, x.dtype(), format);
  const Tensor xc = detached(x, format), wc = detached(w);
  kernels::conv2d_forward(xc, wc, detached(b), out, p);
  // saved: src (laid out as the output), weights (contiguous).
  record(OpKind::Conv2d, conv_inputs(x, w, b), out, {xc, wc}, p);
  return s.done(out);
}

Tensor conv2d_max_pool2d_relu(const Tensor& input, const Tensor& weight, const Tensor& bias,
                              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                              std::array<int64_t, 2> pool_kernel) {
  OpScope s(OpKind::Conv2dMaxPool2dRelu, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  const char* op = op_name(OpKind::Conv2dMaxPool2dRelu);
  Shape conv_shape, out_shape;
  const kernels::Conv2dParams cp = conv_params(op, x, w, b, stride, padding, {1, 1}, 1, conv_shape);
  kernels::Pool2dParams pp =
      pool_params(OpKind::Conv2dMaxPool2dRelu, conv_shape, pool_kernel, pool_kernel, {0, 0}, out_shape);
  pp.relu = true;
  // A one-channel input is laid out alike in both formats (a model's grayscale batch): it takes the fused,
  // channels-last path too, which keeps the network after it channels-last.
  const bool one_channel = x.size(1) == 1 && x.is_contiguous(MemoryFormat::ChannelsLast);
  const MemoryFormat format = one_channel ? MemoryFormat::ChannelsLast : kernels::layer_format(x);
  if (format != MemoryFormat::ChannelsLast || x.dtype() == DType::Float64 || !kernels::max_pool2d_nhwc_fits(pp))
    return s.done(max_pool2d_relu(conv2d(x, w, b, stride, padding), pool_kernel));  // the two ops, unfused
  Tensor out = empty(out_shape, x.dtype(), format);
  const Tensor workspace = empty({out_shape[0], out_shape[2], out_shape[3], out_shape[1]}, DType::UInt8);
  const Tensor xc = detached(x, format), wc = detached(w);
  kernels::conv2d_max_pool_relu_forward(xc, wc, detached(b), out, workspace, conv_shape, cp, pp);
  // saved: src (channels-last), weights (contiguous), pooling's workspace.
  record(OpKind::Conv2dMaxPool2dRelu, conv_inputs(x, w, b), out, {xc, wc, workspace},
         op_params::ConvPool{cp, conv_shape, pp});
  return s.done(out);
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  OpScope s(OpKind::BatchNorm, {input, weight, bias});
  const Tensor &x = s[0], &w = s[1], &b = s[2];
  CASTOR_CHECK(x.dim() == 2 || x.dim() == 4, "batch_norm: expected a (N, C) or (N, C, H, W) input, got ",
               x.describe());
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
  // saved: src (N, C, H, W), mean, var (batch or running statistics), then the float scale and shift of those
  // given.
  std::vector<Tensor> saved = {src, mean, var};
  if (scale.defined()) saved.push_back(scale);
  if (shift.defined()) saved.push_back(shift);
  record(OpKind::BatchNorm, inputs, out, saved, op_params::BatchNorm{training, w.defined(), b.defined(), eps});
  return s.done(out);
}

Tensor max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  return pool2d(OpKind::MaxPool2d, input, kernel, stride, padding, false);
}

Tensor max_pool2d_relu(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding) {
  return pool2d(OpKind::MaxPool2d, input, kernel, stride, padding, false, /*relu=*/true);
}

Tensor avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding, bool count_include_pad) {
  return pool2d(OpKind::AvgPool2d, input, kernel, stride, padding, count_include_pad);
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size) {
  CASTOR_CHECK(input.dim() == 4, "adaptive_avg_pool2d: expected a 4-D (N, C, H, W) input, got ", input.describe());
  CASTOR_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output size ", pair_str(output_size),
               " must be positive");
  const int64_t h = input.size(2), w = input.size(3), oh = output_size[0], ow = output_size[1];
  if (h % oh == 0 && w % ow == 0) return avg_pool2d(input, {h / oh, w / ow});
  // PyTorch's windows: rows [floor(i H / OH), ceil((i + 1) H / OH)), likewise for columns.
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < oh; ++i) {
    const int64_t y0 = i * h / oh, y1 = ((i + 1) * h + oh - 1) / oh;
    std::vector<Tensor> cells;
    for (int64_t j = 0; j < ow; ++j) {
      const int64_t x0 = j * w / ow, x1 = ((j + 1) * w + ow - 1) / ow;
      cells.push_back(mean(input.slice(2, y0, y1).slice(3, x0, x1), {2, 3}, /*keepdim=*/true));
    }
    rows.push_back(cat(cells, 3));
  }
  return cat(rows, 2);
}

Tensor relu(const Tensor& input) { return castor::relu(input); }

Tensor gelu(const Tensor& input, bool tanh_approximate) { return castor::gelu(input, tanh_approximate); }
Tensor silu(const Tensor& input) { return castor::silu(input); }

Tensor embedding(const Tensor& input, const Tensor& weight, int64_t padding_idx) {
  return OpDef<OpKind::Embedding>::forward(weight, input, padding_idx);
}

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return OpDef<OpKind::LayerNorm>::forward(input, normalized_shape, weight, bias, eps);
}

Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, double eps) {
  return OpDef<OpKind::RmsNorm>::forward(input, normalized_shape, weight, eps);
}

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  return OpDef<OpKind::ScaledDotProductAttention>::forward(query, key, value, attn_mask, dropout_p, is_causal, scale);
}

Tensor qkv_attention(const Tensor& qkv, int64_t n_head, bool is_causal, std::optional<double> scale) {
  return OpDef<OpKind::QkvAttention>::forward(qkv, n_head, is_causal, scale);
}

Tensor dropout(const Tensor& input, double p, bool training) {
  CASTOR_CHECK(p >= 0 && p <= 1, "dropout: probability has to be between 0 and 1, but got ", p);
  OpScope s(OpKind::Dropout, {input});
  const Tensor& x = s[0];
  if (!training || p == 0) return s.done(x);
  check_floating("dropout", x);
  Tensor mask;
  {
    NoGradGuard no_grad;
    mask = bernoulli(x.shape(), 1.0 - p, x.dtype());  // 1 keeps an element
    if (p < 1) mask = mul(mask, 1.0 / (1.0 - p));
  }
  return s.done(mul(x, mask));
}

Tensor flatten(const Tensor& input, int64_t start_dim) { return input.flatten(start_dim, -1); }

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, double label_smoothing,
                     int64_t ignore_index, const Tensor& weight) {
  CASTOR_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got ",
               label_smoothing);
  if (!weight.defined() && logits.dim() == 2 && target.dtype() == DType::Int64 && target.dim() == 1) {
    // Fused over the rows (no float32 copy of 16-bit logits), except where PyTorch's mean mixes two denominators:
    // label smoothing with ignored targets (see below).
    const auto t = target.to_vector<int64_t>();
    const int64_t counted = std::count_if(t.begin(), t.end(), [&](int64_t c) { return c != ignore_index; });
    if (!(label_smoothing > 0 && reduction == Reduction::Mean && counted != target.numel())) {
      const Tensor losses = OpDef<OpKind::CrossEntropy>::forward(logits, target, label_smoothing, ignore_index);
      if (reduction == Reduction::None) return losses;
      const Tensor total = sum(losses);
      return reduction == Reduction::Sum ? total : total / static_cast<double>(counted);
    }
  }
  OpScope s(OpKind::CrossEntropy, {logits, weight});
  const Tensor &x = s[0], &w = s[1];
  CASTOR_CHECK(x.dim() == 2, "cross_entropy: expected (N, C) logits, got ", x.describe());
  check_floating("cross_entropy", x);
  const Tensor log_probs = log_softmax(x, 1);
  const Nll nll = nll_terms("cross_entropy", log_probs, target, ignore_index, w);
  const Tensor loss = reduce_weighted(nll, reduction);
  if (label_smoothing == 0) return s.done(loss);
  // PyTorch's smoothing term: -sum_c w_c log p_ic per counted sample, reduced like the loss, except that without
  // class weights its mean runs over all N samples.
  const int64_t c = x.size(1);
  Tensor smooth = -sum(w.defined() ? log_probs * w.view({1, c}) : log_probs, {1}) * nll.valid;
  if (reduction == Reduction::Mean)
    smooth = w.defined() ? sum(smooth) / sum(nll.weight) : mean(smooth);
  else
    smooth = reduce(smooth, reduction);
  return s.done(loss * (1.0 - label_smoothing) + smooth * (label_smoothing / c));
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index,
                const Tensor& weight) {
  OpScope s(OpKind::NllLoss, {log_probs, weight});
  check_floating("nll_loss", s[0]);
  return s.done(reduce_weighted(nll_terms("nll_loss", s[0], target, ignore_index, s[1]), reduction));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  OpScope s(OpKind::MseLoss, {input, target});
  check_same_shape("mse_loss", s[0], s[1]);
  const Tensor diff = s[0] - s[1];
  return s.done(reduce(diff * diff, reduction));
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction) {
  OpScope s(OpKind::BinaryCrossEntropyWithLogits, {logits, target});
  const Tensor &x = s[0], &t = s[1];
  check_same_shape("binary_cross_entropy_with_logits", x, t);
  // PyTorch's stable form: (1 - t) x + m + log(exp(-m) + exp(-x - m)) with m = max(-x, 0).
  const Tensor m = clamp(-x, 0.0, std::nullopt);
  return s.done(reduce((1.0 - t) * x + m + log(exp(-m) + exp(-x - m)), reduction));
}

Tensor binary_cross_entropy(const Tensor& probs, const Tensor& target, Reduction reduction) {
  OpScope s(OpKind::BinaryCrossEntropy, {probs, target});
  const Tensor &p = s[0], &t = s[1];
  check_same_shape("binary_cross_entropy", p, t);
  CASTOR_CHECK(p.numel() == 0 || (min(p).item() >= 0 && max(p).item() <= 1),
               "binary_cross_entropy: all elements of input should be between 0 and 1, got ", p.describe());
  // PyTorch clamps the logarithms at -100 so that probabilities of exactly 0 or 1 give a finite loss.
  const Tensor loss = -(t * clamp(log(p), -100.0, std::nullopt) + (1.0 - t) * clamp(log(1.0 - p), -100.0, std::nullopt));
  return s.done(reduce(loss, reduction));
}

}  // namespace castor::F
