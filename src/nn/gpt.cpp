// nanoGPT's GPT: causal self-attention on the fused attention op, GELU MLP, pre-norm blocks, tied lm_head, GPT-2 init;
// its KV-cached forward.
#include <cmath>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"

namespace castor::models {

void GPTConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    CASTOR_CHECK(v > 0, "GPTConfig: ", name, " must be positive, got ", v);
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("block_size", block_size);
  positive("vocab_size", vocab_size);
  CASTOR_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd ", n_embd, " is not a multiple of n_head ", n_head);
  CASTOR_CHECK(dropout >= 0 && dropout < 1, "GPTConfig: dropout must be in [0, 1), got ", dropout);
  CASTOR_CHECK(real_vocab_size >= 0 && real_vocab_size <= vocab_size, "GPTConfig: real_vocab_size ", real_vocab_size,
               " must be in [1, vocab_size ", vocab_size, "]");
}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c) : n_head_(c.n_head), dropout_(c.dropout) {
  c_attn = register_module("c_attn", std::make_shared<nn::Linear>(c.n_embd, 3 * c.n_embd, c.bias));
  c_proj = register_module("c_proj", std::make_shared<nn::Linear>(c.n_embd, c.n_embd, c.bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  CASTOR_CHECK(x.dim() == 3, "CausalSelfAttention: expected (B, T, C) input, got ", x.describe());
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = n_head_, D = C / H;
  const Tensor qkv = (*c_attn)(x);  // (B, T, 3C)
  const double p = training_ ? dropout_ : 0.0;
  // Without attention dropout one fused node: heads read in place, their gradients written into one (B, T, 3C).
  if (p == 0) return (*resid_dropout)((*c_proj)(F::qkv_attention(qkv, H, /*is_causal=*/true)));
  // q, k, v as (B, H, T, D) views of qkv: the attention kernels read the strided heads in place.
  auto head = [&](int64_t i) { return qkv.narrow(2, i * C, C).view({B, T, H, D}).transpose(1, 2); };
  const Tensor y = F::scaled_dot_product_attention(head(0), head(1), head(2), /*attn_mask=*/{}, p,
                                                   /*is_causal=*/true);  // (B, H, T, D)
  return (*resid_dropout)((*c_proj)(y.transpose(1, 2).reshape({B, T, C})));
}

MLP::MLP(const GPTConfig& c) {
  c_fc = register_module("c_fc", std::make_shared<nn::Linear>(c.n_embd, 4 * c.n_embd, c.bias));
  c_proj = register_module("c_proj", std::make_shared<nn::Linear>(4 * c.n_embd, c.n_embd, c.bias));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor MLP::forward(const Tensor& x) { return (*dropout)((*c_proj)(F::gelu((*c_fc)(x), /*tanh_approximate=*/true))); }

Block::Block(const GPTConfig& c) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(c));
}

Tensor Block::forward(const Tensor& input) {
  Tensor x = input + (*attn)((*ln_1)(input));
  return x + (*mlp)((*ln_2)(x));
}

GPT::GPT(const GPTConfig& c, uint64_t seed) : config_(c) {
  config_.validate();
  nn::SkipInitGuard skip_init;  // the layers' PyTorch-style init is skipped: every weight and bias is set below
  transformer = register_module("transformer", std::make_shared<nn::ModuleDict>());
  wte = transformer->register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  wpe = transformer->register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  drop = transformer->register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  h = transformer->register_module("h", std::make_shared<nn::Sequential>());
  ln_f = transformer->register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
  lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.n_embd, c.vocab_size, /*bias=*/false));
  wte->weight = wte->tie_parameter("weight", lm_head->weight);
  // GPT-2 init, drawn in named_parameters order from one seeded generator (the tied wte/lm_head tensor once): wte,
  // wpe, each block as it is made (ln_f: weight 1, bias 0 as constructed). A loader fills every weight instead.
  Generator gen(seed);
  const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  std::function<void(const std::string&, Tensor&)> draw;
  if (!nn::load_init_dtype())
    draw = [&](const std::string& name, Tensor& p) {
      NoGradGuard no_grad;
      if (name.find(".ln_") != std::string::npos) return;  // LayerNorm: weight 1, bias 0 as constructed
      if (name.ends_with("bias"))
        p.fill_(0.0);
      else
        normal_(p, 0.0, name.ends_with("c_proj.weight") ? std_resid : 0.02, &gen);
    };
  if (draw) {
    draw("transformer.wte.weight", wte->weight);
    draw("transformer.wpe.weight", wpe->weight);
  }
  build_blocks(
      *h, c.n_layer, "transformer.h.", [&](int64_t) { return std::make_shared<Block>(c); }, draw);
}

Tensor GPT::hidden(const Tensor& idx) {
  check_tokens(idx, "GPT", "block size");
  const int64_t T = idx.size(1);
  const Tensor x = (*drop)((*wte)(idx) + (*wpe)(arange(T)));  // (B, T, C) + (T, C)
  return (*ln_f)(run_blocks(*h, x));
}

int64_t GPT::vocab_size() const { return config_.real_vocab_size > 0 ? config_.real_vocab_size : config_.vocab_size; }

LanguageModel::CacheShape GPT::cache_shape() const {
  return {config_.n_layer, config_.n_head, config_.n_embd / config_.n_head, wte->dtype()};
}

Tensor GPT::forward_cached_impl(const Tensor& idx, KVCache& cache) {
  const int64_t B = idx.size(0), n = idx.size(1), C = config_.n_embd, H = config_.n_head, D = C / H;
  std::vector<Tensor> positions;  // each run's rows of wpe
  for (const TokenRun& r : cache.runs()) positions.push_back(wpe->weight.narrow(0, r.prefix, r.length));
  Tensor x = (*wte)(idx) + (positions.size() == 1 ? positions[0] : cat(positions, 0));  // (B, n, C) + (n, C)
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    auto& block = dynamic_cast<Block&>(*(*h)[l]);
    const Tensor qkv = (*block.attn->c_attn)((*block.ln_1)(x));  // (B, n, 3C)
    auto head = [&](int64_t i) { return qkv.narrow(2, i * C, C).view({B, n, H, D}).transpose(1, 2); };
    const Tensor y = cache.attend(l, head(0), head(1), head(2));  // (B, H, n, D)
    x = x + (*block.attn->c_proj)(y.transpose(1, 2).reshape({B, n, C}));
    const Tensor hidden = F::gelu((*block.mlp->c_fc)((*block.ln_2)(x)), /*tanh_approximate=*/true);
    x = x + (*block.mlp->c_proj)(hidden);
  }
  return (*ln_f)(x);  // (B, n, C)
}

std::shared_ptr<GPT> gpt(const GPTConfig& config, uint64_t seed) { return std::make_shared<GPT>(config, seed); }

GPTConfig gpt_preset(const std::string& name, int64_t vocab_size) {
  GPTConfig c;
  c.vocab_size = vocab_size;
  if (name == "gpt-mini") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 384, c.block_size = 256;
  } else if (name == "gpt2") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024, c.vocab_size = 50304;
    c.real_vocab_size = 50257;
  } else if (name != "gpt") {
    throw Error(detail::cat("gpt_preset: unknown preset \"", name, "\"; expected gpt, gpt-mini or gpt2"));
  }
  return c;
}

}  // namespace castor::models
