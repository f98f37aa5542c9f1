// llama2.c's Transformer: RMSNorm pre-norm blocks, rotary grouped-query attention, SwiGLU feed-forward, model.py init;
// with Hugging Face's head size, biases, rope scaling and sliding window.
#include "castor/llama.h"

#include <cmath>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "ops/transformer.h"

namespace castor::models {

int64_t LlamaConfig::ffn_hidden_dim() const {
  if (hidden_dim > 0) return hidden_dim;
  const int64_t h = 2 * (4 * dim) / 3;  // model.py: int(2 * hidden_dim / 3), non-negative so floor
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

void LlamaConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    CASTOR_CHECK(v > 0, "LlamaConfig: ", name, " must be positive, got ", v);
  };
  positive("dim", dim);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  CASTOR_CHECK(n_kv_heads >= 0, "LlamaConfig: n_kv_heads must be positive (or 0: n_heads), got ", n_kv_heads);
  CASTOR_CHECK(hidden_dim >= 0, "LlamaConfig: hidden_dim must be positive (or 0: from multiple_of), got ", hidden_dim);
  if (hidden_dim == 0) positive("multiple_of", multiple_of);
  CASTOR_CHECK(head_dim >= 0, "LlamaConfig: head_dim must be positive (or 0: dim / n_heads), got ", head_dim);
  CASTOR_CHECK(head_dim > 0 || dim % n_heads == 0, "LlamaConfig: dim ", dim, " is not n_heads ", n_heads,
               " x a head size (set head_dim)");
  CASTOR_CHECK(head_size() % 2 == 0, "LlamaConfig: head size ", head_dim > 0 ? "head_dim" : "dim / n_heads", " = ",
               head_size(), " is odd (rotary embeddings rotate pairs)");
  CASTOR_CHECK(n_heads % kv_heads() == 0, "LlamaConfig: n_heads ", n_heads, " is not a multiple of n_kv_heads ",
               kv_heads());
  CASTOR_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "LlamaConfig: norm_eps must be positive, got ", norm_eps);
  CASTOR_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "LlamaConfig: rope_theta must be positive, got ",
               rope_theta);
  CASTOR_CHECK(dropout >= 0 && dropout < 1, "LlamaConfig: dropout must be in [0, 1), got ", dropout);
  CASTOR_CHECK(!(attention_bias && qkv_bias), "LlamaConfig: attention_bias (q, k, v and o) and qkv_bias (q, k, v) ",
               "are exclusive: set one");
  CASTOR_CHECK(sliding_window >= 0, "LlamaConfig: sliding_window must be positive (or 0: none), got ", sliding_window);
  CASTOR_CHECK(sliding_window_from >= 0, "LlamaConfig: sliding_window_from must be a layer index, got ",
               sliding_window_from);
  try {
    rope_scaling.validate();
  } catch (const Error& e) {
    throw Error(detail::cat("LlamaConfig: ", e.what()));
  }
}

LlamaAttention::LlamaAttention(const LlamaConfig& c)
    : n_heads_(c.n_heads),
      n_kv_heads_(c.kv_heads()),
      head_dim_(c.head_size()),
      sliding_window_(c.sliding_window),
      rope_theta_(c.rope_theta),
      dropout_(c.dropout),
      rope_scaling_(c.rope_scaling) {
  const bool qkv = c.attention_bias || c.qkv_bias;
  wq = register_module("wq", std::make_shared<nn::Linear>(c.dim, n_heads_ * head_dim_, qkv));
  wk = register_module("wk", std::make_shared<nn::Linear>(c.dim, n_kv_heads_ * head_dim_, qkv));
  wv = register_module("wv", std::make_shared<nn::Linear>(c.dim, n_kv_heads_ * head_dim_, qkv));
  wo = register_module("wo", std::make_shared<nn::Linear>(n_heads_ * head_dim_, c.dim, c.attention_bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<nn::Dropout>(c.dropout));
}

LlamaAttention::Heads LlamaAttention::project(const Tensor& x, int64_t start_pos) const {
  return project(x, {{x.size(1), start_pos}});
}

LlamaAttention::Heads LlamaAttention::project(const Tensor& x, const std::vector<TokenRun>& runs) const {
  CASTOR_CHECK(x.dim() == 3, "Attention: expected (B, T, dim) input, got ", x.describe());
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  // Rotated as (B, T, heads, D) a run at a time, then heads made a batch dimension: the attention kernels read the
  // strides in place.
  auto rotated = [&](nn::Linear& w, int64_t heads) {
    const Tensor y = w(x).view({B, T, heads, D});
    std::vector<Tensor> parts;
    int64_t at = 0;
    for (const TokenRun& r : runs) {
      parts.push_back(F::rotary_embedding(y.narrow(1, at, r.length), r.prefix, rope_theta_,
                                          F::RotaryPairing::Interleaved, rope_scaling_));
      at += r.length;
    }
    return (parts.size() == 1 ? parts[0] : cat(parts, 1)).transpose(1, 2);
  };
  return {rotated(*wq, n_heads_), rotated(*wk, n_kv_heads_), (*wv)(x).view({B, T, n_kv_heads_, D}).transpose(1, 2)};
}

Tensor LlamaAttention::merge(const Tensor& y) {
  const int64_t B = y.size(0), T = y.size(2);
  return (*wo)(y.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_}));
}

Tensor LlamaAttention::forward(const Tensor& x) {
  const Heads h = project(x, 0);
  const double p = training_ ? dropout_ : 0.0;
  // A sliding window shorter than the sequence is a banded mask; otherwise the attention is plainly causal.
  const int64_t T = x.size(1);
  const bool windowed = sliding_window_ > 0 && T > sliding_window_;
  const Tensor mask = windowed ? causal_mask(T, T, sliding_window_) : Tensor();
  return (*resid_dropout)(merge(F::scaled_dot_product_attention(h.q, h.k, h.v, mask, p, /*is_causal=*/!windowed)));
}

LlamaFeedForward::LlamaFeedForward(const LlamaConfig& c) {
  const int64_t hidden = c.ffn_hidden_dim();
  w1 = register_module("w1", std::make_shared<nn::Linear>(c.dim, hidden, c.mlp_bias));
  w2 = register_module("w2", std::make_shared<nn::Linear>(hidden, c.dim, c.mlp_bias));
  w3 = register_module("w3", std::make_shared<nn::Linear>(c.dim, hidden, c.mlp_bias));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor LlamaFeedForward::forward(const Tensor& x) { return (*dropout)((*w2)(F::swiglu((*w1)(x), (*w3)(x)))); }

LlamaBlock::LlamaBlock(const LlamaConfig& c) {
  attention = register_module("attention", std::make_shared<LlamaAttention>(c));
  feed_forward = register_module("feed_forward", std::make_shared<LlamaFeedForward>(c));
  attention_norm = register_module("attention_norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, c.norm_eps));
  ffn_norm = register_module("ffn_norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, c.norm_eps));
}

Tensor LlamaBlock::forward(const Tensor& x) {
  const Tensor h = x + (*attention)((*attention_norm)(x));
  return h + (*feed_forward)((*ffn_norm)(h));
}

Llama::Llama(const LlamaConfig& c, uint64_t seed) : config_(c) {
  config_.validate();
  nn::SkipInitGuard skip_init;  // the layers' PyTorch-style init is skipped: every weight is drawn below
  tok_embeddings = register_module("tok_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, c.dim));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  layers = register_module("layers", std::make_shared<nn::Sequential>());
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(Shape{c.dim}, c.norm_eps));
  output = register_module("output", std::make_shared<nn::Linear>(c.dim, c.vocab_size, /*bias=*/false));
  // model.py's `tok_embeddings.weight = output.weight`: one tensor, listed first as tok_embeddings.weight.
  if (c.tied) tok_embeddings->weight = tok_embeddings->tie_parameter("weight", output->weight);
  // model.py's init, drawn from one seeded generator in named_parameters order: the embedding, each block as it is
  // made, the output layer (a loader fills every weight instead).
  Generator gen(seed);
  const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  std::function<void(const std::string&, Tensor&)> draw;
  if (!nn::load_init_dtype())
    draw = [&](const std::string& name, Tensor& p) {
      NoGradGuard no_grad;
      if (p.dim() != 2) {
        if (name.ends_with(".bias")) p.zero_();  // RMSNorm weights: 1 as constructed
        return;
      }
      const bool resid = name.ends_with("w3.weight") || name.ends_with("wo.weight");
      normal_(p, 0.0, resid ? std_resid : 0.02, &gen);
    };
  if (draw) draw("tok_embeddings.weight", tok_embeddings->weight);
  build_blocks(
      *layers, c.n_layers, "layers.",
      [&](int64_t i) {
        LlamaConfig layer = c;  // (the layers before sliding_window_from attend fully)
        if (i < c.sliding_window_from) layer.sliding_window = 0;
        return std::make_shared<LlamaBlock>(layer);
      },
      draw);
  if (draw && !c.tied) draw("output.weight", output->weight);  // (norm.weight: 1 as constructed)
}

Tensor Llama::hidden(const Tensor& tokens) {
  check_tokens(tokens, "Llama", "max_seq_len");
  return (*norm)(run_blocks(*layers, (*dropout)((*tok_embeddings)(tokens))));  // (B, T, dim)
}

LanguageModel::CacheShape Llama::cache_shape() const {
  return {config_.n_layers, config_.kv_heads(), config_.head_size(), tok_embeddings->dtype()};
}

Tensor Llama::forward_cached_impl(const Tensor& tokens, KVCache& cache) {
  Tensor x = (*tok_embeddings)(tokens);  // (B, n, dim)
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    auto& block = dynamic_cast<LlamaBlock&>(*(*layers)[l]);
    const LlamaAttention::Heads h = block.attention->project((*block.attention_norm)(x), cache.runs());
    x = x + block.attention->merge(cache.attend(l, h.q, h.k, h.v, block.attention->sliding_window()));
    const Tensor y = (*block.ffn_norm)(x);
    const LlamaFeedForward& ff = *block.feed_forward;
    x = x + (*ff.w2)(F::swiglu((*ff.w1)(y), (*ff.w3)(y)));
  }
  return (*norm)(x);  // (B, n, dim)
}

std::shared_ptr<Llama> llama(const LlamaConfig& config, uint64_t seed) { return std::make_shared<Llama>(config, seed); }

LlamaConfig llama_preset(const std::string& name, int64_t vocab_size) {
  LlamaConfig c;
  c.vocab_size = vocab_size;
  if (name == "llama-260k") {
    // stories260K: hidden 172 = 2/3 of 4 dim rounded up to a multiple of 4.
    c.dim = 64, c.n_layers = 5, c.n_heads = 8, c.n_kv_heads = 4, c.multiple_of = 4, c.max_seq_len = 512;
  } else if (name == "llama-15m") {
    c.dim = 288, c.n_layers = 6, c.n_heads = 6, c.n_kv_heads = 6, c.multiple_of = 32, c.max_seq_len = 256;
  } else if (name == "llama") {
    c.dim = 128, c.n_layers = 4, c.n_heads = 8, c.n_kv_heads = 4, c.multiple_of = 32, c.max_seq_len = 128;
  } else {
    throw Error(detail::cat("llama_preset: unknown preset \"", name, "\"; expected llama, llama-260k or llama-15m"));
  }
  return c;
}

std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_size, double theta) {
  return castor::rotary_tables(positions, head_size, theta);
}

}  // namespace castor::models
