// The standard layers: PyTorch's parameter layouts and default initialisation, forwards through castor::F.
#include <algorithm>
#include <cmath>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/lora.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"

namespace castor::nn {

namespace {

thread_local bool skip_init = false;                   // SkipInitGuard
thread_local std::optional<DType> load_dtype;          // LoadInitGuard
thread_local bool placeholder_weights = false;         // LoadInitGuard's placeholders
thread_local std::function<void(Module&)> take_block;  // BlockInitGuard

// An uninitialised weight of a Conv2d, Linear or Embedding: in a LoadInitGuard's dtype, else float32 (a Linear's
// `placeholder` under a LoadInitGuard with placeholders: one element seen at every index).
Tensor empty_weight(const Shape& shape, bool placeholder = false) {
  const DType dtype = load_dtype.value_or(DType::Float32);
  if (placeholder && placeholder_weights && load_dtype) return empty(Shape(shape.size(), 1), dtype).expand(shape);
  return empty(shape, dtype);
}

// U(-bound, bound) from the default generator; under SkipInitGuard uninitialised, the generator advanced as if drawn.
Tensor init_uniform(const Shape& shape, double bound, bool placeholder = false) {
  if (!skip_init) return uniform(shape, -bound, bound);
  default_generator().discard(static_cast<uint64_t>(shape_numel(shape)));  // one draw a value
  return empty_weight(shape, placeholder);
}

// torch.nn.init.kaiming_uniform_(w, a=sqrt(5)) on a weight with this fan-in, from the default generator.
Tensor kaiming_uniform(const Shape& shape, int64_t fan_in, bool placeholder = false) {
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));  // calculate_gain("leaky_relu", a)
  const double std = gain / std::sqrt(static_cast<double>(fan_in));
  return init_uniform(shape, std::sqrt(3.0) * std, placeholder);
}

// PyTorch's default bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor fan_in_uniform(const Shape& shape, int64_t fan_in) {
  return init_uniform(shape, 1.0 / std::sqrt(static_cast<double>(fan_in)));
}

// input (*, in) x a frozen quantized weight (out, in)^T [+ bias (out), added before the one rounding as PyTorch's
// addmm], as linear with the blocks' values: linear's autocast policy (the product in bfloat16 at O1), one kernel
// (quant::quantized_matmul) each way, the input's (and bias's) gradient only.
Tensor quantized_linear(const Tensor& input, const std::shared_ptr<const quant::QuantizedMatrix>& w,
                        const Tensor& bias) {
  static const amp::CustomOp op = amp::register_op("quantized_linear", CastPolicy::LowerPrecision);
  const int64_t N = w->rows, K = w->cols;
  CASTOR_CHECK(input.dim() >= 1 && input.size(-1) == K && is_floating(input.dtype()), "Linear: input ",
               input.describe(), " does not match the (", N, ", ", K, ") ", quant::block_type(w->type).name, " weight");
  CASTOR_CHECK(!bias.defined() || bias.shape() == Shape{N}, "Linear: expected a bias of shape (", N, "), got ",
               bias.describe());
  auto forward = [w, N, K](autograd::FunctionCtx&, const std::vector<Tensor>& in) {
    const Tensor x = in[0].contiguous();  // (*, K)
    Shape shape = x.shape();
    shape.back() = N;
    Tensor out = empty(shape, x.dtype());
    const Tensor b = in.size() > 1 ? in[1].to(x.dtype()).contiguous() : Tensor();
    if (const int64_t M = x.numel() / K; M > 0)
      quant::quantized_matmul(x.view({M, K}), *w, /*transpose_w=*/false, out.view({M, N}), b);
    return out;
  };
  auto backward = [w, N, K](autograd::FunctionCtx& ctx, const Tensor& g) {
    const Tensor gc = g.contiguous();  // (*, N)
    Shape shape = gc.shape();
    shape.back() = K;
    Tensor dx = empty(shape, gc.dtype());
    if (const int64_t M = gc.numel() / N; M > 0)
      quant::quantized_matmul(gc.view({M, N}), *w, /*transpose_w=*/true, dx.view({M, K}));
    std::vector<Tensor> grads = {dx};
    if (ctx.needs_input_grad().size() > 1)
      grads.push_back(ctx.needs_input_grad()[1] ? sum(gc.view({-1, N}), {0}) : Tensor());
    return grads;
  };
  return autograd::apply_function(forward, backward,
                                  bias.defined() ? std::vector<Tensor>{input, bias} : std::vector<Tensor>{input}, &op,
                                  "quantized_linear");
}

}  // namespace

SkipInitGuard::SkipInitGuard() : prev_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = prev_; }

LoadInitGuard::LoadInitGuard(DType dtype, bool placeholders)
    : prev_(load_dtype), prev_placeholders_(placeholder_weights) {
  load_dtype = dtype;
  placeholder_weights = placeholders;
}
LoadInitGuard::~LoadInitGuard() {
  load_dtype = prev_;
  placeholder_weights = prev_placeholders_;
}

bool is_placeholder(const Tensor& t) {
  return t.defined() && t.numel() > 1 &&
         std::all_of(t.strides().begin(), t.strides().end(), [](int64_t s) { return s == 0; });
}

bool fill_placeholder(const Tensor& t, const Tensor& values) {
  CASTOR_ASSERT(is_placeholder(t), "fill_placeholder of a tensor with memory of its own");
  const auto& memory = values.impl()->storage;
  const bool take = values.dtype() == t.dtype() && values.shape() == t.shape() && values.is_contiguous() &&
                    values.impl()->offset == 0 && memory.use_count() == 1 && memory->nbytes == values.nbytes() &&
                    !values.requires_grad();
  const Tensor own = take ? values : empty(t.shape(), t.dtype());
  t.impl()->storage = own.impl()->storage;
  t.impl()->strides = own.strides();
  t.impl()->offset = 0;
  return take;
}
std::optional<DType> load_init_dtype() { return load_dtype; }

BlockInitGuard::BlockInitGuard(std::function<void(Module&)> take) : prev_(std::move(take_block)) {
  take_block = std::move(take);
}
BlockInitGuard::~BlockInitGuard() { take_block = std::move(prev_); }
void block_built(Module& block) {
  if (take_block && !load_dtype) take_block(block);
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
               Size2 dilation, int64_t groups, bool bias)
    : stride_(stride), padding_(padding), dilation_(dilation), groups_(groups) {
  CASTOR_CHECK(in_channels > 0 && out_channels > 0 && groups > 0 && in_channels % groups == 0 &&
                   out_channels % groups == 0,
               "Conv2d: in_channels ", in_channels, " and out_channels ", out_channels,
               " must be positive and divisible by groups ", groups);
  CASTOR_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "Conv2d: kernel size must be positive, got (", kernel_size.h,
               ", ", kernel_size.w, ")");
  const int64_t fan_in = in_channels / groups * kernel_size.h * kernel_size.w;
  weight = register_parameter(
      "weight", kaiming_uniform({out_channels, in_channels / groups, kernel_size.h, kernel_size.w}, fan_in));
  if (bias) this->bias = register_parameter("bias", fan_in_uniform({out_channels}, fan_in));
}

Tensor Conv2d::forward(const Tensor& input) {
  return F::conv2d(input, weight, bias, stride_.array(), padding_.array(), dilation_.array(), groups_);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias) {
  CASTOR_CHECK(in_features > 0 && out_features > 0, "Linear: in_features ", in_features, " and out_features ",
               out_features, " must be positive");
  weight = register_parameter("weight",
                              kaiming_uniform({out_features, in_features}, in_features, /*placeholder=*/true));
  if (bias) this->bias = register_parameter("bias", fan_in_uniform({out_features}, in_features));
}

int64_t Linear::in_features() const { return quantized ? quantized->cols : weight.size(1); }
int64_t Linear::out_features() const { return quantized ? quantized->rows : weight.size(0); }

void Linear::quantize_weight(quant::BlockType type, bool double_quant) {
  CASTOR_CHECK(!quantized, "Linear: the weight is already quantized");
  CASTOR_CHECK(!lora || !lora->merged(), "Linear: an adapter is merged into the weight");
  const Tensor w = weight.detach().to(DType::Float32).contiguous();  // (out, in)
  quantized = std::make_shared<const quant::QuantizedMatrix>(
      quant::quantize_matrix(w.data<float>(), w.size(0), w.size(1), type, double_quant));
  unregister_parameter("weight");
  weight = Tensor();
}

void Linear::take_blocks(std::shared_ptr<const quant::QuantizedMatrix> blocks) {
  CASTOR_CHECK(blocks && blocks->rows == out_features() && blocks->cols == in_features(), "Linear: blocks of (",
               blocks ? blocks->rows : 0, ", ", blocks ? blocks->cols : 0, ") for a weight of (", out_features(), ", ",
               in_features(), ")");
  CASTOR_CHECK(!lora || !lora->merged(), "Linear: an adapter is merged into the weight");
  if (!quantized) unregister_parameter("weight");
  weight = Tensor();
  quantized = std::move(blocks);
}

void Linear::dequantize_weight(DType dtype) {
  CASTOR_CHECK(quantized, "Linear: the weight is not quantized");
  Tensor w = empty({quantized->rows, quantized->cols});  // (out, in)
  quant::dequantize_rows(*quantized, 0, quantized->rows, w.data<float>());
  weight = register_parameter("weight", w.to(dtype));
  weight.requires_grad_(false);
  quantized.reset();
}

Tensor Linear::forward(const Tensor& input) {
  const Tensor y = quantized ? quantized_linear(input, quantized, bias) : F::linear(input, weight, bias);
  return lora && !lora->merged() ? y + lora->delta(input) : y;
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
    : eps_(eps), momentum_(momentum) {
  CASTOR_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got ", num_features);
  if (affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::Int64));
  }
}

Tensor BatchNorm2d::forward(const Tensor& input) {
  CASTOR_CHECK(input.dim() == 4, "BatchNorm2d: expected a 4-d (N, C, H, W) input, got ", input.describe());
  const bool tracking = running_mean.defined();
  if (training_ && tracking) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1.0);
  }
  if (sync_statistics && training_)
    return F::sync_batch_norm(input, running_mean, running_var, weight, bias, momentum_, eps_);
  return F::batch_norm(input, running_mean, running_var, weight, bias, /*training=*/training_ || !tracking, momentum_,
                       eps_);
}

void convert_sync_batchnorm(Module& module, bool sync) {
  module.apply([sync](Module& m) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) bn->sync_statistics = sync;
  });
}

Tensor ReLU::forward(const Tensor& input) { return F::relu(input); }

Tensor GELU::forward(const Tensor& input) { return F::gelu(input, tanh_approximate_); }

Tensor SiLU::forward(const Tensor& input) { return F::silu(input); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx) : padding_idx_(padding_idx) {
  CASTOR_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes ", num_embeddings, " and ", embedding_dim,
               " must be positive");
  CASTOR_CHECK(padding_idx >= -1 && padding_idx < num_embeddings, "Embedding: padding_idx ", padding_idx,
               " outside [0, ", num_embeddings, ")");
  Tensor w;
  if (skip_init) {
    default_generator().discard_normals(num_embeddings * embedding_dim);
    w = empty_weight({num_embeddings, embedding_dim}, /*placeholder=*/true);
  } else {
    w = normal({num_embeddings, embedding_dim}, 0.0, 1.0);
    if (padding_idx >= 0) w.narrow(0, padding_idx, 1).fill_(0.0);
  }
  weight = register_parameter("weight", w);
}

void Embedding::take_blocks(std::shared_ptr<const quant::QuantizedMatrix> blocks) {
  const Tensor& table = weight.defined() ? weight : Tensor();
  CASTOR_CHECK(blocks && table.defined() && blocks->rows == table.size(0) && blocks->cols == table.size(1),
               "Embedding: blocks of (", blocks ? blocks->rows : 0, ", ", blocks ? blocks->cols : 0,
               ") for a table of ", table.defined() ? shape_str(table.shape()) : "blocks already");
  dtype_ = weight.dtype();
  unregister_parameter("weight");
  weight = Tensor();
  quantized = std::move(blocks);
}

Tensor Embedding::forward(const Tensor& input) {
  if (!quantized) return F::embedding(input, weight, padding_idx_);
  CASTOR_CHECK(input.dtype() == DType::Int64, "Embedding: expected int64 ids, got ", input.describe());
  const Tensor ids = input.contiguous();
  Shape shape = ids.shape();
  shape.push_back(quantized->cols);
  Tensor rows = empty(shape);  // (*, dim): each row exact in float32, then rounded once
  const int64_t* id = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    CASTOR_CHECK(id[i] >= 0 && id[i] < quantized->rows, "Embedding: id ", id[i], " outside [0, ", quantized->rows, ")");
    quant::dequantize_rows(*quantized, id[i], id[i] + 1, rows.data<float>() + i * quantized->cols);
  }
  return rows.to(dtype_);
}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  CASTOR_CHECK(!normalized_shape_.empty() && shape_numel(normalized_shape_) > 0, "LayerNorm: normalized_shape ",
               shape_str(normalized_shape_), " must be non-empty");
  if (!elementwise_affine) return;
  weight = register_parameter("weight", ones(normalized_shape_));
  if (bias) this->bias = register_parameter("bias", zeros(normalized_shape_));
}

Tensor LayerNorm::forward(const Tensor& input) { return F::layer_norm(input, normalized_shape_, weight, bias, eps_); }

RMSNorm::RMSNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  CASTOR_CHECK(!normalized_shape_.empty() && shape_numel(normalized_shape_) > 0, "RMSNorm: normalized_shape ",
               shape_str(normalized_shape_), " must be non-empty");
  if (elementwise_affine) weight = register_parameter("weight", ones(normalized_shape_));
}

Tensor RMSNorm::forward(const Tensor& input) { return F::rms_norm(input, normalized_shape_, weight, eps_); }

Tensor ModuleDict::forward(const Tensor&) {
  CASTOR_CHECK(false, "ModuleDict: a ModuleDict has no forward; call its children");
  return {};
}

Tensor ScaledDotProductAttention::forward(const Tensor&) {
  CASTOR_CHECK(false, "ScaledDotProductAttention: forward takes {q, k, v[, attn_mask]}, not one tensor");
  return {};
}

Tensor ScaledDotProductAttention::forward(const std::vector<Tensor>& inputs) {
  CASTOR_CHECK(inputs.size() == 3 || inputs.size() == 4,
               "ScaledDotProductAttention: forward takes {q, k, v[, "
               "attn_mask]}, got ",
               inputs.size(), " tensors");
  return F::scaled_dot_product_attention(inputs[0], inputs[1], inputs[2], inputs.size() == 4 ? inputs[3] : Tensor(),
                                         training_ ? dropout_ : 0.0, is_causal_);
}

Tensor MaxPool2d::forward(const Tensor& input) {
  return F::max_pool2d(input, kernel_.array(), stride_.array(), padding_.array());
}

Tensor AvgPool2d::forward(const Tensor& input) {
  return F::avg_pool2d(input, kernel_.array(), stride_.array(), padding_.array(), count_include_pad_);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return F::adaptive_avg_pool2d(input, output_size_.array()); }

Dropout::Dropout(double p) : p_(p) { CASTOR_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p); }

Tensor Dropout::forward(const Tensor& input) { return F::dropout(input, p_, training_); }

Tensor Flatten::forward(const Tensor& input) { return F::flatten(input, start_dim_); }

Sequential::Sequential(std::initializer_list<ModulePtr> modules) {
  for (const ModulePtr& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr module) { register_module(std::to_string(size()), std::move(module)); }

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : named_children()) x = child->forward(x);
  return x;
}

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_planes, planes, /*kernel_size=*/3, stride,
                                                            /*padding=*/1, /*dilation=*/1, /*groups=*/1,
                                                            /*bias=*/false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(planes, planes, /*kernel_size=*/3, /*stride=*/1,
                                                            /*padding=*/1, /*dilation=*/1, /*groups=*/1,
                                                            /*bias=*/false));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (stride != 1 || in_planes != planes) {
    downsample = register_module("downsample", std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
                                                   std::make_shared<Conv2d>(in_planes, planes, /*kernel_size=*/1,
                                                                            stride, /*padding=*/0, /*dilation=*/1,
                                                                            /*groups=*/1, /*bias=*/false),
                                                   std::make_shared<BatchNorm2d>(planes)}));
  }
}

// (N, in_planes, H, W) -> (N, planes, H/stride, W/stride)
Tensor BasicBlock::forward(const Tensor& input) {
  Tensor out = F::relu(bn1->forward(conv1->forward(input)));
  out = bn2->forward(conv2->forward(out));
  Tensor shortcut = downsample ? downsample->forward(input) : input;
  return F::relu(out + shortcut);
}

}  // namespace castor::nn
