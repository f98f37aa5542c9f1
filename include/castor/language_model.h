// What every autoregressive language model (nanoGPT's GPT, llama2.c's Llama) gives the trainer, the sampler and
// generation: a forward over token ids, its context and vocabulary, and inference with a KV cache.
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "castor/functional.h"
#include "castor/nn.h"
#include "castor/random.h"

namespace castor::models {

class KVCache;

// A run of the tokens one forward adds to a KV cache (forward_runs): `length` tokens at positions prefix .. prefix +
// length - 1, each attending the cache's first `prefix` positions and its own run's tokens up to itself. Runs with
// one prefix are branches of a tree sharing that prefix's keys and values without copying them (a row's choices
// after its context).
struct TokenRun {
  int64_t length, prefix;
};

// forward(idx): idx (B, T) int64 with T <= block_size() -> logits (B, T, vocab_size()) over the real vocabulary: the
// output layer (head()) on the final hidden states (hidden(idx)). The trainer's loss (lm_loss), evaluation
// (lm_scores) and sampling never hold those logits whole.
class LanguageModel : public nn::Module {
 public:
  Tensor forward(const Tensor& idx) override { return logits(hidden(idx)); }
  // The final norm's output (B, T, C) for idx (B, T): what the output layer reads.
  virtual Tensor hidden(const Tensor& idx) = 0;
  // The output layer (GPT's lm_head, Llama's output): its width may pass vocab_size() (a GPT's padding).
  virtual nn::Linear& head() = 0;
  // The output layer on hidden states (..., C): logits (..., vocab_size()) over the real vocabulary.
  Tensor logits(const Tensor& hidden);
  virtual int64_t block_size() const = 0;  // the longest sequence it reads (GPT's block_size, Llama's max_seq_len)
  virtual int64_t vocab_size() const = 0;  // the tokenizer's vocabulary: the classes of forward's logits
  // Parameters, a tied weight counted once (nanoGPT's get_num_params(non_embedding=False)).
  int64_t num_params() const;
  // What a KV cache holds per layer: n_kv_heads heads (fewer than the query heads under grouped-query attention)
  // of head_dim, in dtype (the model's).
  struct CacheShape {
    int64_t n_layers, n_kv_heads, head_dim;
    DType dtype;
  };
  virtual CacheShape cache_shape() const = 0;
  // Activation recompute (castor train --recompute blocks): each transformer block's forward runs under
  // nn::checkpoint, so only the blocks' inputs are kept for backward and each block is rerun there.
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }
  // The transformer blocks, in order (GPT's h, Llama's layers).
  virtual nn::Sequential& blocks() = 0;
  // ZeRO-3 (nn::ShardedBlocks): gather(i) is called before block i runs (in forward, and again before its rerun in
  // backward under recompute), release(i) once nothing reads its weights any more: right after a run without grad
  // mode (evaluation, recompute's first run) and after the rerun's backward. A block run in grad mode without
  // recompute stays gathered (its backward reads the weights): the caller releases it after backward. prefetch(j),
  // when set, is called right after gather(i) with the block expected to run next (i + 1 in forward, i - 1 in
  // recompute's backward), so its gather can start while block i computes.
  struct BlockHooks {
    std::function<void(size_t)> gather, release, prefetch;
  };
  void set_block_hooks(BlockHooks hooks) { block_hooks_ = std::move(hooks); }

 protected:
  // x (B, T, C) through `blocks` in order, each under nn::checkpoint when recompute() is on (and grad mode is), and
  // between the block hooks when they are set.
  Tensor run_blocks(nn::Sequential& blocks, Tensor x) const;
  // Appends `count` blocks made by make(i) to `blocks` one at a time: each, right after it is made, drawn by
  // draw(prefix + i + "." + name, p) over its parameters in order (when `draw` is set: a model drawn in
  // named_parameters order) and given to nn::block_built, before the next is made (ZeRO-3's sharded construction
  // keeps a slice of each).
  static void build_blocks(nn::Sequential& blocks, int64_t count, const std::string& prefix,
                           const std::function<nn::ModulePtr(int64_t)>& make,
                           const std::function<void(const std::string&, Tensor&)>& draw);
  // forward's argument check: idx (B, T) int64 with T <= block_size(), else castor::Error naming the model ("GPT")
  // and its limit as its config calls it ("block size").
  void check_tokens(const Tensor& idx, const char* model, const char* limit) const;
  friend Tensor forward_cached(LanguageModel& model, const Tensor& idx, KVCache& cache, bool last_only);
  friend Tensor forward_runs(LanguageModel& model, const Tensor& idx, KVCache& cache, const std::vector<TokenRun>& runs,
                             int64_t first, bool keep_first);
  // forward_cached's model part, called without autograd on checked arguments: idx (B, n) at the positions of
  // cache.runs() (forward_cached's one run: cache.size() .. cache.size() + n - 1), each layer attending through
  // cache.attend; returns the final hidden states (B, n, C) that the output layer reads.
  virtual Tensor forward_cached_impl(const Tensor& idx, KVCache& cache) = 0;

 private:
  bool recompute_ = false;
  BlockHooks block_hooks_;
};

// The keys and values every layer of a model computed for the positions it has seen (per layer (batch, kv heads,
// capacity, head dim) in the model's dtype), so that a further token costs attention over them, O(T), instead of a
// forward over the whole prefix. `capacity`: the positions it holds, at most the block size (0: the block size; a
// generation needs only its prompt and new tokens, where a Llama 3's block is 131,072 positions).
class KVCache {
 public:
  explicit KVCache(const LanguageModel& model, int64_t batch_size = 1, int64_t capacity = 0);
  int64_t size() const { return size_; }          // positions held
  int64_t capacity() const { return capacity_; }  // at most block_size
  int64_t batch_size() const { return keys_[0].size(0); }
  void clear() { size_ = 0; }
  // Layer `layer`'s attention for n new positions: stores k and v (B, Hkv, n, D) at positions size() ..
  // size() + n - 1 and returns scaled_dot_product_attention of q (B, H, n, D) over the keys and values of positions
  // 0 .. size() + n - 1 (query i sees keys up to size() + i; with a `window` W > 0 only the last W of them), (B, H, n,
  // D). Keys a window leaves out are not read. Under forward_runs, query i reads what its run says (and, with a
  // window, only the keys of the last W positions before its own).
  Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t window = 0);
  // The runs of the forward in progress, laid end to end along its n tokens (forward_cached: {n, size()}).
  const std::vector<TokenRun>& runs() const { return runs_; }

 private:
  friend Tensor forward_cached(LanguageModel& model, const Tensor& idx, KVCache& cache, bool last_only);
  friend Tensor forward_runs(LanguageModel& model, const Tensor& idx, KVCache& cache, const std::vector<TokenRun>& runs,
                             int64_t first, bool keep_first);
  // The bool mask (n, size() + n) of the runs' attention with a window W (0: none), made once per forward and W.
  const Tensor& runs_mask(int64_t n, int64_t window);
  std::vector<Tensor> keys_, values_;  // per layer: (B, Hkv, capacity, D)
  int64_t size_ = 0, capacity_ = 0;
  std::vector<TokenRun> runs_;
  bool several_runs_ = false;                          // forward_runs' (runs_ is not one run continuing the cache)
  std::vector<std::pair<int64_t, Tensor>> run_masks_;  // (window, runs_mask) of the forward in progress
};

// The bool attention mask (queries, keys) of the last `queries` positions of `keys` (query i at position keys -
// queries + i, bottom-right aligned): true where key j <= that position and, with a window W > 0, j > position - W
// (Mistral's sliding window: the last W keys, itself included).
Tensor causal_mask(int64_t queries, int64_t keys, int64_t window = 0);

// Runs the tokens `idx` (B, n) int64 at positions cache.size() .. cache.size() + n - 1 through `model`, reading the
// earlier positions' keys and values from `cache` and appending theirs: the logits (B, n, output width: a padded
// GPT's every row) those model.forward gives for these positions over the whole sequence; with `last_only` those of
// the last position only (B, 1, width), all that sampling reads. Without autograd and without dropout;
// castor::Error when the cache would pass block_size.
Tensor forward_cached(LanguageModel& model, const Tensor& idx, KVCache& cache, bool last_only = false);

// forward_cached over `runs` laid end to end along idx (B, n) (their lengths summing to n, none empty; each run's
// prefix at most the slots before it, cache.size() + its offset, so that it reads only keys already there; its last
// position below block_size): each token at its run's position, attending as TokenRun says, so a context run once and
// several continuations after it share its keys and values in one forward. Returns the logits of tokens first .. n - 1
// (B, n - first, output width). Afterwards the cache holds its positions and, with `keep_first`, the first run's
// tokens (that run must continue the cache: prefix == cache.size()); the other runs' keys are dropped.
// castor::Error when the runs are not so.
Tensor forward_runs(LanguageModel& model, const Tensor& idx, KVCache& cache, const std::vector<TokenRun>& runs,
                    int64_t first, bool keep_first);

// The next-token loss of idx (B, T) against target (B, T) (F.cross_entropy of forward's logits, reduced as asked over
// the targets other than -100, PyTorch's ignore_index):
// F::linear_cross_entropy on the hidden states and the output layer, so the logits are never held whole (with a
// LoRA adapter on the output layer, or its weight in quantized blocks, cross_entropy of the layer's own forward on
// chunks of about 4M logits, each chunk under nn::checkpoint: its logits computed again in backward).
Tensor lm_loss(LanguageModel& model, const Tensor& idx, const Tensor& target,
               F::Reduction reduction = F::Reduction::Mean, double label_smoothing = 0.0);

// Evaluation without autograd: the summed loss of idx (B, T) against target (B, T) (targets -100 left out) and each position's argmax class
// (the lowest of equal maxima), the logits computed a chunk of about 4M at a time.
struct LmScores {
  double loss_sum = 0;
  std::vector<int64_t> predicted;  // (B T)
};
LmScores lm_scores(LanguageModel& model, const Tensor& idx, const Tensor& target);

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
// over the real vocabulary (ids >= vocab_size(), a GPT's padding, are never drawn) divided by `temperature`,
// restricted to the `top_k` largest (0: all; ties with the k-th kept), from a generator seeded with `seed`;
// temperature 0 (or below kMinTemperature) takes the argmax (the lowest id among equal maxima). A prompt longer than
// block_size is cut to its last block_size tokens, as nanoGPT does. While the text fits the block, each new token is
// one cached position (forward_cached; the cache holds the prompt and new tokens, at most a block); past it, `window`
// says what the model sees. castor::Error when the logits
// are not finite (NaN or infinite weights) or an argument is out of range: every id drawn is in [0, vocab_size()).
// `top_p` in (0, 1): llama2.c run.c's nucleus sampling after the temperature and top-k (sample_token).
std::vector<int64_t> generate(LanguageModel& model, std::vector<int64_t> prompt, int64_t max_new_tokens,
                              double temperature = 1.0, int64_t top_k = 0, uint64_t seed = 0,
                              Window window = Window::Sliding, double top_p = 1.0);
// The same tokens, each passed to `emit` as it is drawn (the prompt is not); generation ends early when emit returns
// false. Memory stays bounded by the block size however many tokens are made, so a caller can stream them.
void generate(LanguageModel& model, std::vector<int64_t> prompt, int64_t max_new_tokens, double temperature,
              int64_t top_k, uint64_t seed, Window window, const std::function<bool(int64_t)>& emit,
              double top_p = 1.0);

// One token drawn from `logits` (finite, else castor::Error): the argmax at temperature 0 (or below
// kMinTemperature); else softmax(logits / temperature) restricted to the top_k largest (0: all; ties with the k-th
// kept) and then, for top_p in (0, 1), run.c's sample_topp: the tokens of probability >= (1 - top_p) / (V - 1) in
// descending order (equal ones by id), cut after the first whose cumulative probability exceeds top_p, one drawn with
// r = u * (their cumulative probability); u = gen.next_double().
int64_t sample_token(std::vector<double> logits, double temperature, int64_t top_k, double top_p, Generator& gen);

}  // namespace castor::models
