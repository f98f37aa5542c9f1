// Language-model inference with a KV cache: forward_cached (one position's work per new token) and nanoGPT's
// generate, sliding its window as nanoGPT does or rebuilding the cache from half a block.
#include <algorithm>
#include <cmath>
#include <limits>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/language_model.h"
#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "kernels/transformer.h"

namespace castor::models {

int64_t LanguageModel::num_params() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void LanguageModel::check_tokens(const Tensor& idx, const char* model, const char* limit) const {
  CASTOR_CHECK(idx.dim() == 2 && idx.dtype() == DType::Int64, model, ": expected (B, T) int64 token ids, got ",
               idx.describe());
  CASTOR_CHECK(idx.size(1) <= block_size(), model, ": cannot forward a sequence of length ", idx.size(1), ", ", limit,
               " is only ", block_size());
}

Tensor LanguageModel::logits(const Tensor& hidden) {
  const Tensor out = head()(hidden);  // (..., output width)
  const int64_t real = vocab_size();
  return real < out.size(-1) ? out.narrow(out.dim() - 1, 0, real) : out;
}

namespace {

// The rows of hidden states whose logits are computed at once: about 4M logits.
int64_t logit_rows(const LanguageModel& model) { return std::max<int64_t>(1, (int64_t{1} << 22) / model.vocab_size()); }

// cross_entropy of the output layer's own forward (its adapter, or its blocks) on h (N, C) against t (N), a chunk of
// logit_rows at a time, each under nn::checkpoint: only one chunk's logits (and their gradient) are ever held, its
// logits computed again in backward (a 128,256-word vocabulary's logits of 512 rows and their gradient in float32
// would be about 0.8 GB). The chunks' sums, reduced as cross_entropy reduces: a mean over the targets other than -100,
// but where label smoothing meets ignored targets PyTorch's smoothing term is a mean over all N rows.
Tensor chunked_head_loss(LanguageModel& model, const Tensor& h, const Tensor& t, F::Reduction reduction,
                         double label_smoothing) {
  const int64_t N = h.size(0), rows = logit_rows(model);
  const auto ids = t.to_vector<int64_t>();
  const auto counted = static_cast<double>(std::count_if(ids.begin(), ids.end(), [](int64_t c) { return c != -100; }));
  const bool mixed = reduction == F::Reduction::Mean && label_smoothing > 0 && counted != static_cast<double>(N);
  const F::Reduction each = reduction == F::Reduction::None ? F::Reduction::None : F::Reduction::Sum;
  auto run = [&model, each, mixed, label_smoothing, counted, N](const std::vector<Tensor>& in) {
    const Tensor logits = model.logits(in[0]);
    if (!mixed) return F::cross_entropy(logits, in[1], each, label_smoothing, /*ignore_index=*/-100);
    const Tensor nll = F::cross_entropy(logits, in[1], each, 0.0, -100);
    const Tensor smooth = F::cross_entropy(logits, in[1], each, 1.0, -100);  // (each counted row's term)
    return nll * ((1.0 - label_smoothing) / counted) + smooth * (label_smoothing / static_cast<double>(N));
  };
  std::vector<Tensor> parts;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    parts.push_back(nn::checkpoint(run, {h.narrow(0, r0, n), t.narrow(0, r0, n)}));
  }
  if (reduction == F::Reduction::None) return cat(parts, 0);
  Tensor total = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) total = total + parts[i];
  return reduction == F::Reduction::Sum || mixed ? total : total / counted;
}

// F::linear_cross_entropy's two passes with a frozen quantized output layer (no adapter): its rows dequantized a block
// of classes at a time into h's dtype (linear's autocast policy: bfloat16 at O1), twice a step (forward, backward),
// where cross-entropy of the chunked logits would dequantize the whole layer three times a chunk. The gradient reaches
// h only. Reduced as linear_cross_entropy reduces (label smoothing with ignored targets under a mean excepted).
Tensor quantized_head_loss(const std::shared_ptr<const quant::QuantizedMatrix>& w, const Tensor& h, const Tensor& t,
                           int64_t classes, F::Reduction reduction, double label_smoothing) {
  static const amp::CustomOp op = amp::register_op("quantized_linear_cross_entropy", CastPolicy::LowerPrecision);
  constexpr int64_t kChunk = int64_t{1} << 22, kIgnore = -100;  // logits a block, as linear_cross_entropy's default
  const Tensor tc = t.contiguous();
  auto rows = [w](const Tensor& x) {
    return [w, &x](int64_t c0, int64_t n) {
      Tensor tile = empty({n, w->cols}, x.dtype());  // (n, C)
      quant::dequantize_tile_to(*w, c0, c0 + n, 0, w->cols, tile);
      return tile;
    };
  };
  auto forward = [w, tc, classes, label_smoothing, rows](autograd::FunctionCtx& ctx, const std::vector<Tensor>& in) {
    const Tensor x = in[0].contiguous();  // (N, C)
    const DType stat = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
    Tensor losses = empty({x.size(0)}, stat), lse = empty({x.size(0)}, stat);
    kernels::linear_cross_entropy_forward(x, rows(x), tc, classes, kChunk, kIgnore, label_smoothing, losses, lse);
    ctx.save_for_backward({x, lse});
    return losses;
  };
  auto backward = [w, tc, classes, label_smoothing, rows](autograd::FunctionCtx& ctx, const Tensor& g) {
    const Tensor &x = ctx.saved_tensors()[0], &lse = ctx.saved_tensors()[1];
    Tensor diff_x = zeros(x.shape(), lse.dtype());  // (N, C), summed over the blocks and rounded once
    kernels::linear_cross_entropy_backward(x, rows(x), tc, lse, g.to(lse.dtype()).contiguous(), classes, kChunk,
                                           kIgnore, label_smoothing, Tensor(), diff_x);
    return std::vector<Tensor>{diff_x.to(x.dtype())};
  };
  const Tensor losses = autograd::apply_function(forward, backward, {h}, &op, "quantized_linear_cross_entropy");
  if (reduction == F::Reduction::None) return losses;
  const auto ids = tc.to_vector<int64_t>();
  const auto counted = static_cast<double>(
      std::count_if(ids.begin(), ids.end(), [](int64_t c) { return c != kIgnore; }));
  return reduction == F::Reduction::Sum ? sum(losses) : sum(losses) / counted;
}

}  // namespace

Tensor lm_loss(LanguageModel& model, const Tensor& idx, const Tensor& target, F::Reduction reduction,
               double label_smoothing) {
  nn::Linear& head = model.head();
  const Tensor h = model.hidden(idx);  // (B, T, C)
  const auto ids = target.reshape({-1}).to_vector<int64_t>();
  const bool mixed = reduction == F::Reduction::Mean && label_smoothing > 0 &&
                     std::count(ids.begin(), ids.end(), -100) > 0;  // (linear_cross_entropy refuses it)
  if (head.quantized && !head.lora && !mixed)
    return quantized_head_loss(head.quantized, h.reshape({-1, h.size(-1)}), target.reshape({-1}), model.vocab_size(),
                               reduction, label_smoothing);
  if (head.lora || head.quantized)
    return chunked_head_loss(model, h.reshape({-1, h.size(-1)}), target.reshape({-1}), reduction, label_smoothing);
  return F::linear_cross_entropy(h.reshape({-1, h.size(-1)}), head.weight, target.reshape({-1}), reduction,
                                 label_smoothing, /*ignore_index=*/-100, model.vocab_size());
}

LmScores lm_scores(LanguageModel& model, const Tensor& idx, const Tensor& target) {
  NoGradGuard no_grad;
  const Tensor hidden = model.hidden(idx), h = hidden.reshape({-1, hidden.size(-1)}), t = target.reshape({-1});
  const int64_t N = h.size(0), rows = logit_rows(model);
  LmScores s;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    const Tensor logits = model.logits(h.narrow(0, r0, n));  // (n, vocab_size)
    s.loss_sum += F::cross_entropy(logits, t.narrow(0, r0, n), F::Reduction::Sum, 0.0, /*ignore_index=*/-100).item();
    for (int64_t p : argmax(logits, 1).to_vector<int64_t>()) s.predicted.push_back(p);
  }
  return s;
}

void LanguageModel::build_blocks(nn::Sequential& blocks, int64_t count, const std::string& prefix,
                                 const std::function<nn::ModulePtr(int64_t)>& make,
                                 const std::function<void(const std::string&, Tensor&)>& draw) {
  for (int64_t i = 0; i < count; ++i) {
    nn::ModulePtr block = make(i);
    blocks.push_back(block);
    if (draw)
      for (auto& [name, p] : block->named_parameters()) draw(prefix + std::to_string(i) + "." + name, p);
    nn::block_built(*block);
  }
}

Tensor LanguageModel::run_blocks(nn::Sequential& blocks, Tensor x) const {
  const BlockHooks& hooks = block_hooks_;
  const bool recompute = recompute_ && GradMode::is_enabled();
  const size_t n = blocks.size();
  for (size_t i = 0; i < n; ++i) {
    nn::Module& block = *blocks[i];
    auto run = [&block, &hooks, i, n, recompute](const std::vector<Tensor>& in) {
      if (hooks.gather) hooks.gather(i);
      // (under recompute, a run in grad mode is the rerun in backward, which goes from the last block to the first)
      const bool backward = recompute && GradMode::is_enabled();
      if (hooks.prefetch && (backward ? i > 0 : i + 1 < n)) hooks.prefetch(backward ? i - 1 : i + 1);
      Tensor out = block(in[0]);
      if (hooks.release && !GradMode::is_enabled()) hooks.release(i);  // (nothing saved the weights)
      return out;
    };
    std::function<void()> after;
    if (hooks.release) after = [&hooks, i] { hooks.release(i); };
    x = recompute ? nn::checkpoint(run, {x}, after) : run({x});
  }
  return x;
}

KVCache::KVCache(const LanguageModel& model, int64_t batch_size, int64_t capacity)
    : capacity_(capacity > 0 ? std::min(capacity, model.block_size()) : model.block_size()) {
  const LanguageModel::CacheShape s = model.cache_shape();
  CASTOR_CHECK(batch_size > 0, "KVCache: batch_size must be positive, got ", batch_size);
  CASTOR_CHECK(capacity >= 0, "KVCache: capacity must be positive (or 0: the block size), got ", capacity);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    keys_.push_back(empty({batch_size, s.n_kv_heads, capacity_, s.head_dim}, s.dtype));
    values_.push_back(empty({batch_size, s.n_kv_heads, capacity_, s.head_dim}, s.dtype));
  }
}

Tensor causal_mask(int64_t queries, int64_t keys, int64_t window) {
  CASTOR_CHECK(queries >= 0 && queries <= keys && window >= 0, "causal_mask: ", queries, " queries over ", keys,
               " keys, window ", window);
  std::vector<double> m(queries * keys);
  for (int64_t i = 0; i < queries; ++i) {
    const int64_t pos = keys - queries + i;
    for (int64_t j = 0; j < keys; ++j) m[i * keys + j] = j <= pos && (window == 0 || j > pos - window);
  }
  return tensor(m, Shape{queries, keys}, DType::Bool);
}

const Tensor& KVCache::runs_mask(int64_t n, int64_t window) {
  for (const auto& [w, mask] : run_masks_)
    if (w == window) return mask;
  const int64_t p = size_, keys = p + n;
  std::vector<int64_t> pos(keys), run_start(keys, 0), run_prefix(keys, 0);  // each slot's position, its run's
  for (int64_t j = 0; j < p; ++j) pos[j] = j;
  int64_t at = p;
  for (const TokenRun& r : runs_)
    for (int64_t i = 0; i < r.length; ++i, ++at)
      pos[at] = r.prefix + i, run_start[at] = at - i, run_prefix[at] = r.prefix;
  std::vector<double> m(n * keys);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t q = p + t;
    for (int64_t j = 0; j < keys; ++j) {
      const bool seen = j < run_prefix[q] || (j >= run_start[q] && j <= q);
      m[t * keys + j] = seen && (window == 0 || pos[j] > pos[q] - window);
    }
  }
  run_masks_.emplace_back(window, tensor(m, Shape{n, keys}, DType::Bool));
  return run_masks_.back().second;
}

Tensor KVCache::attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t window) {
  const int64_t p = size_, n = q.size(2);
  keys_[layer].narrow(2, p, n).copy_(k);
  values_[layer].narrow(2, p, n).copy_(v);
  if (several_runs_)
    return F::scaled_dot_product_attention(q, keys_[layer].narrow(2, 0, p + n), values_[layer].narrow(2, 0, p + n),
                                           runs_mask(n, window));  // (B, H, n, D)
  // Query i (position p + i) attends keys from..p + i, from = 0 or p + i - window + 1: the keys before the first
  // query's window are not read. One query needs no mask, a block whose keys start with it and fit the window is
  // causal (top-left aligned), any other block needs the mask spelled out.
  const int64_t from = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0, keys = p + n - from;
  const bool causal = n > 1 && keys == n && (window == 0 || n <= window);
  const Tensor mask = n > 1 && !causal ? causal_mask(n, keys, window) : Tensor();
  return F::scaled_dot_product_attention(q, keys_[layer].narrow(2, from, keys), values_[layer].narrow(2, from, keys),
                                         mask, /*dropout_p=*/0.0, causal);  // (B, H, n, D)
}

Tensor forward_cached(LanguageModel& model, const Tensor& idx, KVCache& cache, bool last_only) {
  CASTOR_CHECK(idx.dim() == 2 && idx.dtype() == DType::Int64, "forward_cached: expected (B, n) int64 token ids, got ",
               idx.describe());
  const int64_t n = idx.size(1);
  CASTOR_CHECK(n > 0 && cache.size_ + n <= cache.capacity_, "forward_cached: ", n, " tokens after ", cache.size_,
               " cached positions pass the block size ", cache.capacity_);
  return forward_runs(model, idx, cache, {{n, cache.size_}}, last_only ? n - 1 : 0, /*keep_first=*/true);
}

Tensor forward_runs(LanguageModel& model, const Tensor& idx, KVCache& cache, const std::vector<TokenRun>& runs,
                    int64_t first, bool keep_first) {
  CASTOR_CHECK(idx.dim() == 2 && idx.dtype() == DType::Int64, "forward_runs: expected (B, n) int64 token ids, got ",
               idx.describe());
  const int64_t B = idx.size(0), n = idx.size(1), p = cache.size_;
  CASTOR_CHECK(B == cache.batch_size(), "forward_runs: batch of ", B, " rows, the cache holds ", cache.batch_size());
  CASTOR_CHECK(!runs.empty() && p + n <= cache.capacity_, "forward_runs: ", n, " tokens after ", p,
               " cached positions pass the cache's ", cache.capacity_);
  int64_t at = p;
  for (const TokenRun& r : runs) {
    CASTOR_CHECK(r.length > 0 && r.prefix >= 0 && r.prefix <= at && r.prefix + r.length <= model.block_size(),
                 "forward_runs: a run of ", r.length, " tokens after a prefix of ", r.prefix, " at slot ", at,
                 " (a block of ", model.block_size(), ")");
    at += r.length;
  }
  CASTOR_CHECK(at == p + n && first >= 0 && first < n && (!keep_first || runs[0].prefix == p), "forward_runs: runs of ",
               at - p, " tokens for ", n, ", logits from ", first, keep_first ? ", the first kept" : "");
  NoGradGuard no_grad;
  cache.runs_ = runs;
  cache.several_runs_ = runs.size() > 1 || runs[0].prefix != p;
  cache.run_masks_.clear();
  const Tensor hidden = model.forward_cached_impl(idx, cache);  // (B, n, C)
  cache.size_ = p + (keep_first ? runs[0].length : 0);
  cache.several_runs_ = false;
  cache.run_masks_.clear();
  return model.head()(first > 0 ? hidden.narrow(1, first, n - first) : hidden);
}

int64_t sample_token(std::vector<double> logits, double temperature, int64_t top_k, double top_p, Generator& gen) {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (int64_t i = 0; i < V; ++i)
    CASTOR_CHECK(std::isfinite(logits[i]), "generate: the logit of token ", i, " is ", logits[i],
                 " (the weights hold NaN or infinite values, or overflow)");
  if (temperature < kMinTemperature) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (double& l : logits) l /= temperature;  // finite: float logits over a temperature >= kMinTemperature
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[top_k - 1];
    for (double& l : logits)
      if (l < kth) l = -std::numeric_limits<double>::infinity();
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0;  // >= 1: the largest term is exp(0)
  for (double& l : logits) total += (l = std::exp(l - top));
  if (top_p > 0 && top_p < 1) {  // run.c's sample_topp over the probabilities
    const double cutoff = (1 - top_p) / static_cast<double>(std::max<int64_t>(1, V - 1));
    std::vector<std::pair<double, int64_t>> kept;
    for (int64_t i = 0; i < V; ++i)
      if (logits[i] / total >= cutoff) kept.emplace_back(logits[i] / total, i);
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    double cumulative = 0;
    size_t last = kept.size() - 1;
    for (size_t i = 0; i < kept.size(); ++i) {
      cumulative += kept[i].first;
      if (cumulative > top_p) {
        last = i;
        break;
      }
    }
    const double r = gen.next_double() * cumulative;
    double cdf = 0;
    for (size_t i = 0; i <= last; ++i)
      if (r < (cdf += kept[i].first)) return kept[i].second;
    return kept[last].second;
  }
  double u = gen.next_double() * total;
  for (int64_t i = 0; i < V; ++i) {
    if (logits[i] == 0) continue;
    if ((u -= logits[i]) < 0) return i;
  }
  // Rounding left u at or above zero: the last token with any probability (there is one: the maximum's is 1).
  int64_t last = V - 1;
  while (logits[last] == 0) --last;
  return last;
}

void generate(LanguageModel& model, std::vector<int64_t> prompt, int64_t max_new_tokens, double temperature,
              int64_t top_k, uint64_t seed, Window window, const std::function<bool(int64_t)>& emit, double top_p) {
  const int64_t real_vocab = model.vocab_size(), T = model.block_size();
  CASTOR_CHECK(!prompt.empty(), "generate: the prompt is empty (it needs at least one token)");
  CASTOR_CHECK(max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  CASTOR_CHECK(temperature >= 0 && std::isfinite(temperature), "generate: temperature must be >= 0, got ", temperature);
  CASTOR_CHECK(top_k >= 0, "generate: top_k must be >= 0, got ", top_k);
  CASTOR_CHECK(top_p >= 0 && top_p <= 1, "generate: top_p must be in [0, 1], got ", top_p);
  for (int64_t t : prompt)
    CASTOR_CHECK(t >= 0 && t < real_vocab, "generate: prompt token ", t, " is outside the vocabulary [0, ", real_vocab,
                 ")");
  Generator gen(seed);
  // (the prompt fed and the new tokens but the last, never fed: the cache fills only where they pass the block)
  KVCache cache(model, 1,
                std::min<int64_t>(T, static_cast<int64_t>(prompt.size())) + std::max<int64_t>(max_new_tokens, 1));
  // The tokens the model may still read: at most the last block_size (older ones are dropped as new ones come).
  std::vector<int64_t> seq = std::move(prompt);
  // Feeds seq[from, end) after what the cache holds; returns the last position's logits over the real vocabulary.
  auto feed = [&](size_t from) {
    std::vector<double> ids(seq.begin() + from, seq.end());
    const Tensor logits = forward_cached(model, tensor(ids, Shape{1, static_cast<int64_t>(ids.size())}, DType::Int64),
                                         cache, /*last_only=*/true);  // (1, 1, output width)
    return logits.select(1, 0).narrow(1, 0, real_vocab).to_vector<double>();
  };
  std::vector<double> logits = feed(seq.size() > static_cast<size_t>(T) ? seq.size() - T : 0);
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t next = sample_token(logits, temperature, top_k, top_p, gen);
    seq.push_back(next);
    if (!emit(next) || i + 1 == max_new_tokens) break;
    if (seq.size() > 2 * static_cast<size_t>(T)) seq.erase(seq.begin(), seq.end() - T);
    if (cache.size() < T) {
      logits = feed(seq.size() - 1);
    } else if (window == Window::Cached) {
      cache.clear();
      logits = feed(seq.size() - std::max<int64_t>(1, T / 2));
    } else {  // nanoGPT: idx_cond = idx[:, -block_size:], a full forward
      NoGradGuard no_grad;
      std::vector<double> ids(seq.end() - T, seq.end());
      const Tensor hidden = model.hidden(tensor(ids, Shape{1, T}, DType::Int64));  // (1, T, C)
      logits = model.logits(hidden.select(1, T - 1)).to_vector<double>();          // (1, real vocabulary)
    }
  }
}

std::vector<int64_t> generate(LanguageModel& model, std::vector<int64_t> prompt, int64_t max_new_tokens,
                              double temperature, int64_t top_k, uint64_t seed, Window window, double top_p) {
  std::vector<int64_t> seq = prompt;
  generate(
      model, std::move(prompt), max_new_tokens, temperature, top_k, seed, window,
      [&](int64_t t) {
        seq.push_back(t);
        return true;
      },
      top_p);
  return seq;
}

}  // namespace castor::models
