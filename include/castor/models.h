// Ready-made models with PyTorch's state-dict names: image classifiers (SimpleCNN, CIFAR ResNet-18, DAWNBench
// ResNet-9) and nanoGPT's GPT.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "castor/language_model.h"
#include "castor/nn.h"

namespace castor::models {

// conv1 (3x3, 32, pad 1) -> max_pool 2 -> relu -> conv2 (3x3, 64, pad 1) -> max_pool 2 -> relu -> flatten
// -> fc1 (64*(H/4)*(W/4) -> 128) -> relu -> fc2 (128 -> num_classes). Input (N, C, H, W).
class SimpleCNN : public nn::Module {
 public:
  SimpleCNN(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SimpleCNN"; }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// torchvision's resnet18 in its CIFAR form: a 3x3 stride-1 stem conv (64) and no max-pool, then layer1..4 of
// two BasicBlocks each (64/128/256/512 planes, strides 1/2/2/2), adaptive average pool to 1x1, fc. Conv
// weights are re-drawn as torchvision does: kaiming_normal_(mode="fan_out", nonlinearity="relu").
class ResNet18 : public nn::Module {
 public:
  ResNet18(int64_t in_channels, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet"; }
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::Linear> fc;
};

// The DAWNBench ResNet-9 (Myrtle.ai): each stage is conv3x3 (no bias) -> BatchNorm -> relu, as a Sequential.
// prep (64); layer1 (128) + max_pool 2, plus residual res1 (two 128 stages); layer2 (256) + max_pool 2;
// layer3 (512) + max_pool 2, plus residual res3 (two 512 stages); adaptive max pool to 1x1; fc (512 ->
// num_classes, no bias); logits scaled by 0.125.
class ResNet9 : public nn::Module {
 public:
  ResNet9(int64_t in_channels, int64_t num_classes);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet9"; }
  std::shared_ptr<nn::Sequential> prep, layer1, res1, layer2, layer3, res3;
  std::shared_ptr<nn::Linear> fc;
};

std::shared_ptr<SimpleCNN> simple_cnn(int64_t in_channels, int64_t height, int64_t width, int64_t num_classes = 10);
std::shared_ptr<ResNet18> resnet18(int64_t in_channels = 3, int64_t num_classes = 10);
std::shared_ptr<ResNet9> resnet9(int64_t in_channels = 3, int64_t num_classes = 10);

// "simplecnn", "resnet18" or "resnet9"; other names raise a castor::Error listing these.
nn::ModulePtr make_model(const std::string& name, int64_t in_channels, int64_t height, int64_t width,
                         int64_t num_classes);

}  // namespace castor::models

namespace castor::models {

// nanoGPT's GPTConfig. vocab_size is the padded size the embedding and lm_head have (llm.c's Vp); real_vocab_size,
// when smaller, is the tokenizer's (50,257 for GPT-2): rows past it are storage only, never a class (the logits
// cover the real vocabulary, so losses and sampling leave the padding out and its gradient rows stay zero, as llm.c).
struct GPTConfig {
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, vocab_size = 50304;
  double dropout = 0.0;
  bool bias = true;
  int64_t real_vocab_size = 0;  // 0: vocab_size
  void validate() const;        // a castor::Error naming the field otherwise
};

// nanoGPT's CausalSelfAttention: c_attn (C -> 3C), heads of C / n_head, causal fused attention, c_proj (C -> C).
class CausalSelfAttention : public nn::Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& config);
  Tensor forward(const Tensor& input) override;  // (B, T, C) -> (B, T, C)
  std::string type_name() const override { return "CausalSelfAttention"; }
  std::shared_ptr<nn::Linear> c_attn, c_proj;
  std::shared_ptr<nn::Dropout> resid_dropout;

 private:
  int64_t n_head_;
  double dropout_;
};

// c_fc (C -> 4C), GELU (tanh form, as GPT-2), c_proj (4C -> C), dropout.
class MLP : public nn::Module {
 public:
  explicit MLP(const GPTConfig& config);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<nn::Linear> c_fc, c_proj;
  std::shared_ptr<nn::Dropout> dropout;
};

// Pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Block : public nn::Module {
 public:
  explicit Block(const GPTConfig& config);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

// nanoGPT's GPT with its parameter names: transformer.{wte, wpe, h.N, ln_f}, lm_head (tied to wte). GPT-2 init:
// N(0, 0.02) for embeddings and Linear weights, N(0, 0.02 / sqrt(2 n_layer)) for attn.c_proj and mlp.c_proj,
// zero biases. forward: idx (B, T) int64 -> logits (B, T, real_vocab_size): with a padded vocabulary, a view of
// lm_head's (B, T, vocab_size) output without the padding columns.
class GPT : public LanguageModel {
 public:
  explicit GPT(const GPTConfig& config, uint64_t seed = 1337);
  Tensor hidden(const Tensor& idx) override;  // ln_f's output (B, T, n_embd)
  nn::Linear& head() override { return *lm_head; }
  nn::Sequential& blocks() override { return *h; }
  std::string type_name() const override { return "GPT"; }
  const GPTConfig& config() const { return config_; }
  int64_t block_size() const override { return config_.block_size; }
  int64_t vocab_size() const override;  // real_vocab_size, or vocab_size without padding
  CacheShape cache_shape() const override;
  std::shared_ptr<nn::Module> transformer;  // holds wte, wpe, drop, h, ln_f
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Sequential> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;

 protected:
  Tensor forward_cached_impl(const Tensor& idx, KVCache& cache) override;  // (B, n, n_embd)

 private:
  GPTConfig config_;
};

std::shared_ptr<GPT> gpt(const GPTConfig& config, uint64_t seed = 1337);
// Presets: "gpt-mini" (6 layers, 6 heads, 384 wide, block 256) and "gpt2" (124M: 12/12/768, block 1024, vocab
// 50,257 padded to 50,304).
GPTConfig gpt_preset(const std::string& name, int64_t vocab_size);

}  // namespace castor::models
