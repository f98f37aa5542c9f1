// The F:: ops recorded as the ops they are made of (linear, dropout, adaptive pooling, the losses; cross-entropy
// where it cannot take its fused path) and F::'s aliases of castor:: ops; the F:: layer and transformer ops are
// defined with their definitions (ops/layers.cpp, ops/transformer.cpp).
#include "castor/functional.h"

#include <algorithm>
#include <cmath>

#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "ops/transformer.h"
#include "runtime/dispatch.h"

namespace castor::F {

namespace {

std::string pair_str(std::array<int64_t, 2> v) { return detail::cat("(", v[0], ", ", v[1], ")"); }

void check_floating(const char* op, const Tensor& t) {
  CASTOR_CHECK(is_floating(t.dtype()), op, ": expected a floating-point input, got ", t.describe());
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
  CASTOR_CHECK(!weight.defined() || weight.shape() == Shape{c}, op, ": expected class weights of shape (", c, "), got ",
               weight.describe());
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  std::vector<double> safe(n), valid(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = t[i] == ignore_index;
    CASTOR_CHECK(ignored || (t[i] >= 0 && t[i] < c), op, ": target ", t[i], " of sample ", i, " is out of bounds for ",
                 c, " classes");
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

Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& target, Reduction reduction,
                            double label_smoothing, int64_t ignore_index, int64_t classes, int64_t chunk) {
  CASTOR_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
               "linear_cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  CASTOR_CHECK(weight.dim() == 2, "linear_cross_entropy: expected a 2-D (V, C) weight, got ", weight.describe());
  const auto t = target.to_vector<int64_t>();
  const int64_t counted = std::count_if(t.begin(), t.end(), [&](int64_t c) { return c != ignore_index; });
  CASTOR_CHECK(!(label_smoothing > 0 && reduction == Reduction::Mean && counted != target.numel()),
               "linear_cross_entropy: label smoothing with ignored targets under a mean is not supported (use "
               "cross_entropy, or reduction Sum)");
  const Tensor losses = OpDef<OpKind::LinearCrossEntropy>::forward(input, weight, target, label_smoothing, ignore_index,
                                                                   classes > 0 ? classes : weight.size(0), chunk);
  if (reduction == Reduction::None) return losses;
  const Tensor total = sum(losses);
  return reduction == Reduction::Sum ? total : total / static_cast<double>(counted);
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
  const Tensor loss = -(t * clamp(log(p), -100.0, std::nullopt) +
                        (1.0 - t) * clamp(log(1.0 - p), -100.0, std::nullopt));
  return s.done(reduce(loss, reduction));
}

}  // namespace castor::F
