// Ready-made image classifiers (SimpleCNN, CIFAR ResNet-18, DAWNBench ResNet-9) with PyTorch's state-dict names.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& config, uint64_t seed = 1337);
  Tensor forward(const Tensor& idx) override;
  std::string type_name() const override { return "GPT"; }
  const GPTConfig& config() const { return config_; }
  // Parameters without the tied lm_head (nanoGPT's get_num_params(non_embedding=False) counts wte once).
  int64_t num_params() const;
  std::shared_ptr<nn::Module> transformer;  // holds wte, wpe, drop, h, ln_f
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Sequential> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;

 private:
  GPTConfig config_;
};

std::shared_ptr<GPT> gpt(const GPTConfig& config, uint64_t seed = 1337);
// Presets: "gpt-mini" (6 layers, 6 heads, 384 wide, block 256) and "gpt2" (124M: 12/12/768, block 1024, vocab
// 50,257 padded to 50,304).
GPTConfig gpt_preset(const std::string& name, int64_t vocab_size);

}  // namespace castor::models

namespace castor::models {

// The keys and values every layer of a GPT computed for the positions it has seen (batch, heads, block_size, head
// dim per layer, float32), so that a further token costs attention over them, O(T), instead of a forward over the
// whole prefix.
class KVCache {
 public:
  explicit KVCache(const GPT& model, int64_t batch_size = 1);
  int64_t size() const { return size_; }  // positions held
  int64_t capacity() const { return capacity_; }  // block_size
  void clear() { size_ = 0; }

 private:
  friend Tensor forward_cached(GPT& model, const Tensor& idx, KVCache& cache);
  std::vector<Tensor> keys_, values_;  // per layer: (B, H, block_size, D)
  int64_t size_ = 0, capacity_ = 0;
};

// Runs the tokens `idx` (B, n) int64 at positions cache.size() .. cache.size() + n - 1 through `model`, reading the
// earlier positions' keys and values from `cache` and appending theirs: the logits (B, n, vocab_size), those
// model.forward gives for these positions over the whole sequence. Without autograd and without dropout; castor::Error
// when the cache would pass block_size.
Tensor forward_cached(GPT& model, const Tensor& idx, KVCache& cache);

// What generate() conditions each token on once the text passes block_size. Both give the same tokens while it fits.
enum class Window {
  Sliding,  // nanoGPT's generate: the last block_size tokens, every step (past the block, one full forward a token)
  Cached,   // the KV cache, rebuilt from the last block_size / 2 tokens when it fills (a context of half a block to
            // a block; past the block, a cached step a token and one rebuild every block_size / 2 tokens)
};

// Sampling temperatures in (0, kMinTemperature) are taken as 0 (greedy), their limit: dividing logits by a
// temperature that small (a subnormal such as 1e-310) would overflow to infinity.
inline constexpr double kMinTemperature = 1e-4;

// nanoGPT's generate: returns `prompt` followed by `max_new_tokens` tokens, each drawn from the last position's logits
// over the real vocabulary (ids >= real_vocab_size, the padding, are never drawn) divided by `temperature`,
// restricted to the `top_k` largest (0: all; ties with the k-th kept), from a generator seeded with `seed`;
// temperature 0 (or below kMinTemperature) takes the argmax (the lowest id among equal maxima). A prompt longer than
// block_size is cut to its last block_size tokens, as nanoGPT does. While the text fits the block, each new token is
// one cached position (forward_cached); past it, `window` says what the model sees. castor::Error when the logits
// are not finite (NaN or infinite weights) or an argument is out of range: every id drawn is in [0, real_vocab_size).
std::vector<int64_t> generate(GPT& model, std::vector<int64_t> prompt, int64_t max_new_tokens,
                              double temperature = 1.0, int64_t top_k = 0, uint64_t seed = 0,
                              Window window = Window::Sliding);
// The same tokens, each passed to `emit` as it is drawn (the prompt is not): memory stays bounded by the block size
// however many tokens are made, so a caller can stream them.
void generate(GPT& model, std::vector<int64_t> prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
              uint64_t seed, Window window, const std::function<void(int64_t)>& emit);

}  // namespace castor::models
