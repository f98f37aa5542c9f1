// Llama-family language models as llama2.c's model.py builds them (RMSNorm, rotary embeddings, grouped-query
// attention, SwiGLU feed-forward, no biases), with the options Hugging Face's Llama, Mistral and Qwen2 add: an explicit
// head size, biases, rope scaling and a sliding attention window.
#pragma once
#include <memory>
#include <string>

#include "castor/functional.h"
#include "castor/language_model.h"
#include "castor/nn.h"

namespace castor::models {

// llama2.c's ModelArgs (its train.py's small-model defaults: the 15M model, multiple_of 32). The fields after
// `dropout` are Hugging Face's (configuration_llama.py, _mistral, _qwen2); their defaults are llama2.c's model.
struct LlamaConfig {
  int64_t dim = 288, n_layers = 6, n_heads = 6;
  int64_t n_kv_heads = 0;  // 0: n_heads (multi-head attention); fewer: grouped-query attention
  int64_t vocab_size = 32000;
  int64_t hidden_dim = 0;    // 0: from multiple_of, as model.py: 4 dim, then 2/3 of it, rounded up to multiple_of
  int64_t multiple_of = 32;  // only read when hidden_dim is 0
  double norm_eps = 1e-5;
  int64_t max_seq_len = 256;
  double rope_theta = 10000.0;
  bool tied = true;  // output shares tok_embeddings' weight (model.py always does; false: its own weight)
  double dropout = 0.0;
  int64_t head_dim = 0;             // 0: dim / n_heads; else the head size (HF's head_dim, which may differ from it)
  bool attention_bias = false;      // wq, wk, wv and wo have biases (HF Llama's attention_bias)
  bool qkv_bias = false;            // wq, wk and wv have biases, wo none (Qwen2's q/k/v_proj)
  bool mlp_bias = false;            // w1, w2 and w3 have biases (HF Llama's mlp_bias)
  F::RopeScaling rope_scaling;      // HF's rope_scaling: none, linear or llama3
  int64_t sliding_window = 0;       // 0: none; W: query i attends keys i - W + 1 .. i only (Mistral's sliding_window)
  int64_t sliding_window_from = 0;  // the first layer the window applies to, earlier ones attend fully (Qwen2's
                                    // max_window_layers)

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / n_heads; }
  int64_t ffn_hidden_dim() const;  // hidden_dim, or model.py's rule when it is 0
  void validate() const;           // a castor::Error naming the field otherwise
};

// Attention with rotary embeddings on q and k (interleaved pairs, llama2.c's; scaled as config.rope_scaling) and
// n_kv_heads key/value heads shared by n_heads / n_kv_heads query heads each: wq (dim -> H D), wk and wv
// (dim -> Hkv D), wo (H D -> dim), D = config.head_size(); biases as config.attention_bias / qkv_bias; causal, within
// config.sliding_window keys when it is set.
class LlamaAttention : public nn::Module {
 public:
  explicit LlamaAttention(const LlamaConfig& config);
  Tensor forward(const Tensor& input) override;  // (B, T, dim) -> (B, T, dim), causal, positions from 0
  std::string type_name() const override { return "Attention"; }
  // q (B, H, T, D), k and v (B, Hkv, T, D) of `input` (B, T, dim) at positions start_pos .. start_pos + T - 1,
  // q and k rotated.
  struct Heads {
    Tensor q, k, v;
  };
  Heads project(const Tensor& input, int64_t start_pos) const;
  // The same over input's T tokens laid out as `runs` (their lengths summing to T), each run from its prefix.
  Heads project(const Tensor& input, const std::vector<TokenRun>& runs) const;
  // wo of the heads y (B, H, T, D) merged back to (B, T, H D) (forward adds resid_dropout).
  Tensor merge(const Tensor& y);
  int64_t sliding_window() const { return sliding_window_; }
  std::shared_ptr<nn::Linear> wq, wk, wv, wo;
  std::shared_ptr<nn::Dropout> resid_dropout;

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_, sliding_window_;
  double rope_theta_, dropout_;
  F::RopeScaling rope_scaling_;
};

// w2(swiglu(w1 x, w3 x)) then dropout: w1 and w3 (dim -> hidden), w2 (hidden -> dim), biases as config.mlp_bias.
class LlamaFeedForward : public nn::Module {
 public:
  explicit LlamaFeedForward(const LlamaConfig& config);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "FeedForward"; }
  std::shared_ptr<nn::Linear> w1, w2, w3;
  std::shared_ptr<nn::Dropout> dropout;
};

// Pre-norm block: h = x + attention(attention_norm(x)), then h + feed_forward(ffn_norm(h)).
class LlamaBlock : public nn::Module {
 public:
  explicit LlamaBlock(const LlamaConfig& config);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "TransformerBlock"; }
  std::shared_ptr<LlamaAttention> attention;
  std::shared_ptr<LlamaFeedForward> feed_forward;
  std::shared_ptr<nn::RMSNorm> attention_norm, ffn_norm;
};

// llama2.c's Transformer with its parameter names: tok_embeddings, layers.N.{attention.{wq,wk,wv,wo},
// feed_forward.{w1,w2,w3}, attention_norm, ffn_norm}, norm, output (tied to tok_embeddings unless !config.tied).
// Init as model.py: N(0, 0.02) for the embedding and every Linear weight, N(0, 0.02 / sqrt(2 n_layers)) for w3 and
// wo, RMSNorm weights 1, biases 0; drawn in named_parameters order from one generator seeded with `seed`.
// forward: tokens (B, T) int64, T <= max_seq_len -> logits (B, T, vocab_size). KV-cached generation rotates q and k
// at their cache positions and caches n_kv_heads heads.
class Llama : public LanguageModel {
 public:
  explicit Llama(const LlamaConfig& config, uint64_t seed = 1337);
  Tensor hidden(const Tensor& tokens) override;  // norm's output (B, T, dim)
  nn::Linear& head() override { return *output; }
  nn::Sequential& blocks() override { return *layers; }
  std::string type_name() const override { return "Transformer"; }
  const LlamaConfig& config() const { return config_; }
  int64_t block_size() const override { return config_.max_seq_len; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  CacheShape cache_shape() const override;
  std::shared_ptr<nn::Embedding> tok_embeddings;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> output;

 protected:
  Tensor forward_cached_impl(const Tensor& tokens, KVCache& cache) override;

 private:
  LlamaConfig config_;
};

std::shared_ptr<Llama> llama(const LlamaConfig& config, uint64_t seed = 1337);

// The rotary tables cos and sin (positions, head_size / 2) in float32 as llama2.c's precompute_freqs_cis, the ones
// the attention rotates with (shared, read-only views).
std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_size, double theta);
// Presets over `vocab_size` tokens: "llama-260k" (dim 64, 5 layers, 8 heads, 4 kv heads, context 512) and "llama-15m"
// (288, 6, 6, 6, context 256), llama2.c's stories260K and stories15M shapes, and "llama" (128, 4, 8, 4, context 128),
// `castor train --model llama`'s default.
LlamaConfig llama_preset(const std::string& name, int64_t vocab_size);

}  // namespace castor::models
