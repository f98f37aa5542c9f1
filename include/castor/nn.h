// torch.nn for Castor: Module (named parameters, buffers, children, state dicts) and the standard layers.
#pragma once
#include <array>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "castor/state_dict.h"
#include "castor/tensor.h"

namespace castor::quant {
struct QuantizedMatrix;  // castor/quant.h
enum class BlockType : int32_t;
}  // namespace castor::quant

namespace castor::nn {

// A (height, width) pair that a single int also converts to, as PyTorch's `kernel_size=3`.
struct Size2 {
  int64_t h, w;
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, like PyTorch's int-or-tuple arguments
  Size2(int64_t h, int64_t w) : h(h), w(w) {}
  std::array<int64_t, 2> array() const { return {h, w}; }
};

// What load_state_dict(strict=false) skipped: keys the module has but the dict lacks, and the reverse.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module;
struct LoraAdapter;  // castor/lora.h
using ModulePtr = std::shared_ptr<Module>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The base of every layer and model. Parameters, buffers and children are kept in registration order, and
// their hierarchical names ("layer1.0.conv1.weight") are PyTorch's. Modules are held by std::shared_ptr.
class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& input) = 0;
  // Modules of several inputs (attention: q, k, v, mask) override this; the default takes exactly one input.
  virtual Tensor forward(const std::vector<Tensor>& inputs);
  // forward() between the hooks, as PyTorch's __call__: each forward pre-hook may replace the input (each input of
  // a multi-input module) and each forward hook the output (an undefined result keeps it). amp::initialize
  // patches O2/O3 casts in this way.
  Tensor operator()(const Tensor& input);
  Tensor operator()(const std::vector<Tensor>& inputs);
  using ForwardHook = std::function<Tensor(const Tensor&)>;
  void register_forward_pre_hook(ForwardHook hook) { forward_pre_hooks_.push_back(std::move(hook)); }
  void register_forward_hook(ForwardHook hook) { forward_hooks_.push_back(std::move(hook)); }
  bool has_forward_hooks() const { return !forward_pre_hooks_.empty() || !forward_hooks_.empty(); }
  virtual std::string type_name() const = 0;  // PyTorch's class name: "Conv2d", "ResNet"
  // Norm layers (BatchNorm, LayerNorm, RMSNorm) keep float32 parameters under to(dtype, /*keep_norms_fp32=*/true)
  // (Apex O2's keep_batchnorm_fp32, Megatron's practice for LayerNorm).
  virtual bool keeps_fp32_params() const { return false; }

  // Registration. Names must be non-empty, free of '.', and unique within this module. The returned tensor
  // shares its TensorImpl with the registry, so a layer may keep it as a member: to() and load_state_dict()
  // change that TensorImpl in place, as PyTorch changes `param.data`.
  Tensor register_parameter(const std::string& name, const Tensor& value);  // made a leaf requiring grad
  // Replaces this module's parameter `name` with another module's parameter itself (weight tying, as nanoGPT's
  // `wte.weight = lm_head.weight`): one tensor, one gradient summed over both uses, listed once by parameters()
  // (under its first name), under both names by state_dict(); a state dict may leave either name out.
  Tensor tie_parameter(const std::string& name, const Tensor& parameter);
  Tensor register_buffer(const std::string& name, const Tensor& value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Removes child `name` (Python's `del module.name`); an error when there is none.
  void unregister_module(const std::string& name);
  // Removes parameter `name` of this module (a weight kept elsewhere, Linear::quantize_weight); an error when none.
  void unregister_parameter(const std::string& name);

  // Queries; `recurse` walks children depth-first after this module's own entries, as PyTorch does.
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, ModulePtr>>& named_children() const { return children_; }
  std::vector<ModulePtr> children() const;

  // Modes and conversions; each applies to all descendants and returns *this.
  Module& train(bool mode = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Casts floating parameters (and their gradients) and floating buffers; with keep_norms_fp32, modules whose
  // keeps_fp32_params() is true are left as they are; with frozen_only, only parameters that do not require grad
  // (and no buffers).
  Module& to(DType dtype, bool keep_norms_fp32 = false, bool frozen_only = false);
  Module& apply(const std::function<void(Module&)>& fn);  // children first, then this module
  // Zeroes every parameter's gradient, or drops it (set_to_none; PyTorch 1.13's default is false).
  void zero_grad(bool set_to_none = false);

  // Parameters then buffers of each module, children after their parent. Values are detached tensors that
  // share storage with the module's.
  StateDict state_dict() const;
  // Copies the dict's values into this module's tensors, converting dtype. Mis-shaped entries (and floating
  // values for non-floating tensors or the reverse) are always errors; missing and unexpected keys are errors
  // when `strict`. One castor::Error names every problem, and nothing is copied then.
  LoadResult load_state_dict(const StateDict& state_dict, bool strict = true);

 protected:
  bool training_ = true;

 private:
  void add_child(const std::string& name, ModulePtr module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool params, bool buffers, bool recurse, NamedTensors& out) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
  std::vector<ForwardHook> forward_pre_hooks_, forward_hooks_;
};

// While one is alive on this thread, Conv2d, Linear and Embedding leave their weights and biases uninitialised and
// advance the default generator exactly as their random initialisation would: for a model that initialises every
// such parameter itself (GPT, Llama), whose default generator then draws (dropout) as it would without the guard.
// The layers' constant initial values (LayerNorm's ones and zeros) are kept.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool prev_;
};

// For a loader that then fills every parameter from a file (models::load_weights_into): while one is alive on this
// thread, the layers leave their weights uninitialised as under SkipInitGuard, made in `dtype` (norm layers' in
// float32, as Module::to(dtype, keep_norms_fp32) leaves them), and models::gpt and models::llama draw none of their
// own. A LoRA run's frozen base is then never held in float32, and no weight is drawn only to be overwritten.
// With `placeholders`, a Linear's weight holds no memory at all (is_placeholder: one element seen at every index)
// until the loader gives it its own (fill_placeholder) or replaces it by blocks (Linear::take_blocks): a base
// loaded quantized is never held dense, not even uninitialised.
class LoadInitGuard {
 public:
  explicit LoadInitGuard(DType dtype, bool placeholders = false);
  ~LoadInitGuard();
  LoadInitGuard(const LoadInitGuard&) = delete;
  LoadInitGuard& operator=(const LoadInitGuard&) = delete;

 private:
  SkipInitGuard skip_;
  std::optional<DType> prev_;
  bool prev_placeholders_;
};
// Whether `t` is a placeholder weight (LoadInitGuard with placeholders); fill_placeholder gives it memory in place, so
// every holder of the tensor (its module, a tied one) sees it: `values`' own memory when they are of t's shape and
// dtype, contiguous and alone in it (a loader's freshly read tensor: no second copy of a weight is ever made), and
// then returns true; otherwise memory of its own (uninitialised, contiguous), into which the caller copies, and false.
bool is_placeholder(const Tensor& t);
bool fill_placeholder(const Tensor& t, const Tensor& values);
// The dtype of the LoadInitGuard alive on this thread; nullopt when none is.
std::optional<DType> load_init_dtype();

// ZeRO-3's sharded construction (DeepSpeed's zero.Init): while one is alive on this thread, a language model's
// constructor hands each transformer block to `take` as soon as the block's weights are drawn and before it makes the
// next (block_built), so that the caller can keep its slice of the block and free the rest: the model is never whole.
// Under a LoadInitGuard nothing is handed over (the loader fills the weights afterwards).
class BlockInitGuard {
 public:
  explicit BlockInitGuard(std::function<void(Module& block)> take);
  ~BlockInitGuard();
  BlockInitGuard(const BlockInitGuard&) = delete;
  BlockInitGuard& operator=(const BlockInitGuard&) = delete;

 private:
  std::function<void(Module&)> prev_;
};
// Called by a model's constructor with each block whose weights are final: the BlockInitGuard's `take`, if any.
void block_built(Module& block);

// input (N, in, H, W) -> (N, out, H', W'). weight (out, in/groups, kh, kw), bias (out).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Conv2d"; }
  Tensor weight, bias;  // bias undefined without one

 private:
  Size2 stride_, padding_, dilation_;
  int64_t groups_;
};

// input (N, in) -> (N, out). weight (out, in), bias (out). With a LoRA adapter (nn::apply_lora, lora.h) the
// output is W x + b + scaling * B(A(dropout(x))) unless the adapter is merged into W.
// A frozen Linear may hold its weight quantized instead (quantize_weight): no parameter "weight" then, and the
// forward runs F::quantized_linear on the blocks.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Linear"; }
  int64_t in_features() const;
  int64_t out_features() const;
  // Stores the weight in `type`'s blocks (double_quant: NF4's absmaxes double-quantized) and drops the dense one;
  // the blocks are frozen. castor::Error for an adapter merged in, or rows that are not whole blocks (nothing
  // changed then).
  void quantize_weight(quant::BlockType type, bool double_quant);
  // The reverse: a dense frozen weight of the blocks' values (exact in float32) in `dtype`, the blocks dropped.
  void dequantize_weight(DType dtype = DType::Float32);
  // Holds `blocks` (a file's, as they are stored) as its frozen weight, the dense one dropped. castor::Error for
  // blocks of another shape than (out, in) or an adapter merged in (nothing changed then).
  void take_blocks(std::shared_ptr<const quant::QuantizedMatrix> blocks);
  Tensor weight, bias;  // weight undefined while quantized
  std::shared_ptr<const quant::QuantizedMatrix> quantized;
  std::shared_ptr<LoraAdapter> lora;  // null without an adapter
};

// input (N, C, H, W). weight/bias (C) when affine; running_mean/var (C) and num_batches_tracked (int64 scalar)
// when tracking running stats. Batch statistics are used in training or when no running stats are tracked.
// With sync_statistics (torch.nn.SyncBatchNorm) the training statistics are those of the global batch: per-channel
// float32 sums over every rank's (N, H, W), all-reduced in forward and again (their gradients) in backward.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "BatchNorm2d"; }
  bool keeps_fp32_params() const override { return true; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  bool sync_statistics = false;

 private:
  double eps_, momentum_;
};

// Sets sync_statistics on every BatchNorm2d in `module` (PyTorch's SyncBatchNorm.convert_sync_batchnorm).
void convert_sync_batchnorm(Module& module, bool sync = true);

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ReLU"; }
};

class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximate = false) : tanh_approximate_(tanh_approximate) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "GELU"; }

 private:
  bool tanh_approximate_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SiLU"; }
};

// indices (*) int64 -> (*, embedding_dim). weight (num_embeddings, embedding_dim) ~ N(0, 1), padding_idx's row 0.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Embedding"; }
  // Holds `blocks` (a file's, (num_embeddings, embedding_dim) as they are stored) as its frozen table, the dense one
  // dropped: the forward then gives each id's row dequantized, rounded once into the weight's dtype, with no
  // gradient. castor::Error for blocks of another shape (nothing changed then).
  void take_blocks(std::shared_ptr<const quant::QuantizedMatrix> blocks);
  DType dtype() const { return weight.defined() ? weight.dtype() : dtype_; }  // of the rows it gives
  Tensor weight;                                                              // undefined while quantized
  std::shared_ptr<const quant::QuantizedMatrix> quantized;

 private:
  int64_t padding_idx_;
  DType dtype_ = DType::Float32;  // the rows' dtype while quantized
};

// Over the trailing normalized_shape: weight 1, bias 0 (elementwise_affine), statistics in float32.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm"; }
  bool keeps_fp32_params() const override { return true; }
  Tensor weight, bias;  // undefined without affine / bias

 private:
  Shape normalized_shape_;
  double eps_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, double eps = 1e-6, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "RMSNorm"; }
  bool keeps_fp32_params() const override { return true; }
  Tensor weight;

 private:
  Shape normalized_shape_;
  double eps_;
};

// F::scaled_dot_product_attention as a module of inputs {q, k, v[, attn_mask]}: causal, with dropout in training.
class ScaledDotProductAttention : public Module {
 public:
  explicit ScaledDotProductAttention(bool is_causal = false, double dropout = 0.0)
      : is_causal_(is_causal), dropout_(dropout) {}
  using Module::forward;
  Tensor forward(const Tensor& input) override;  // refuses: it takes q, k, v
  Tensor forward(const std::vector<Tensor>& inputs) override;
  std::string type_name() const override { return "ScaledDotProductAttention"; }

 private:
  bool is_causal_;
  double dropout_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0)  // stride 0: the kernel size
      : kernel_(kernel_size), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MaxPool2d"; }

 private:
  Size2 kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0, bool count_include_pad = true)
      : kernel_(kernel_size), stride_(stride), padding_(padding), count_include_pad_(count_include_pad) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AvgPool2d"; }

 private:
  Size2 kernel_, stride_, padding_;
  bool count_include_pad_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size_(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  Size2 output_size_;
};

// Zeroes elements with probability p in training (scaling the rest by 1/(1-p)); the identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }

 private:
  double p_;
};

// (N, C, H, W) -> (N, C*H*W), channel-major.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Flatten"; }

 private:
  int64_t start_dim_;
};

// Runs its children in order; they are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<ModulePtr> modules);
  void push_back(ModulePtr module);
  size_t size() const { return named_children().size(); }
  const ModulePtr& operator[](size_t i) const { return named_children().at(i).second; }
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sequential"; }
};

// Named children without a forward of its own (torch.nn.ModuleDict): gives its children their names' prefix.
class ModuleDict : public Module {
 public:
  Tensor forward(const Tensor& input) override;  // refuses: a ModuleDict is not called
  std::string type_name() const override { return "ModuleDict"; }
};

// torchvision's ResNet BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convs without
// bias, conv1 strided; the shortcut is `downsample` (1x1 strided conv + BatchNorm) when the stride is not 1
// or the channel count changes, else the identity.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> downsample;  // null for the identity shortcut
};

// torch.utils.checkpoint: fn(inputs) run without keeping its activations; backward runs it again to rebuild them,
// under the autocast state (dtype, enabled, cache_enabled) and the default generator's state (dropout draws the
// same masks) of the first run, then back-propagates through the rebuilt graph, so the inputs' and the
// parameters' gradients are those of fn(inputs) run plainly, bit for bit. Only the inputs are kept between forward
// and backward. fn must be deterministic apart from the default generator and must not change its inputs in place.
// Without grad mode (evaluation, no_grad) it is fn(inputs). Parameters inside fn get gradients even where no input
// requires grad (a LoRA run's frozen embeddings), as with torch.utils.checkpoint(use_reentrant=False).
// `after_backward`, if set, is called once the rerun's backward is done (ZeRO-3 frees the block's gathered weights).
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                  std::function<void()> after_backward = {});

}  // namespace castor::nn
