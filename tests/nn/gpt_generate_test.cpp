// Language-model inference with a KV cache (GPT, and Llama with grouped-query attention and rotary embeddings at the
// cache positions) against full forwards over the same prefix: the cached logits, runs branching after a shared
// prefix (forward_runs), greedy generation, seeded sampling, top-k and the padding rows of the vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "io/file_test_util.h"
#include "nn/tiny_gpt.h"
#include "nn/tiny_llama.h"
#include "test_util.h"

namespace castor {
namespace {

std::vector<int64_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = static_cast<int64_t>(gen.next_double() * vocab);
  return v;
}

Tensor ids(const std::vector<int64_t>& v, int64_t rows = 1) {
  return tensor(std::vector<double>(v.begin(), v.end()), Shape{rows, static_cast<int64_t>(v.size()) / rows},
                DType::Int64);
}

// The last position's logits of a full forward over seq[start, end).
std::vector<double> full_last_logits(models::LanguageModel& model, const std::vector<int64_t>& seq, size_t start) {
  NoGradGuard no_grad;
  const Tensor logits = model(ids(std::vector<int64_t>(seq.begin() + start, seq.end())));
  return logits.select(1, logits.size(1) - 1).select(0, 0).to_vector<double>();
}

// The window generate() runs each step on: seq[start, end). Past T tokens, Sliding (nanoGPT) takes the last T;
// Cached rebuilds from the last T/2 when the window passes T.
size_t next_start(const std::vector<int64_t>& seq, size_t start, int64_t T, models::Window window) {
  if (seq.size() - start <= static_cast<size_t>(T)) return start;
  return window == models::Window::Sliding ? seq.size() - T : seq.size() - T / 2;
}

// A prompt block from position 0 (causal), single tokens (no mask), a block after cached keys (explicit mask): the
// logits of a full forward over the block size (16) of a 67-token vocabulary.
void expect_cached_logits_equal_full_forward(models::LanguageModel& model) {
  const int64_t B = 2, T = 16;
  const std::vector<int64_t> seq = random_tokens(B * T, 67, 3);
  const Tensor all = ids(seq, B);  // (2, 16)
  Tensor full;
  {
    NoGradGuard no_grad;
    full = model(all);  // (2, 16, 67)
  }
  models::KVCache cache(model, B);
  int64_t p = 0;
  for (int64_t n : {5, 1, 1, 4, 1, 2, 2}) {
    const Tensor got = models::forward_cached(model, all.narrow(1, p, n).contiguous(), cache);
    ASSERT_EQ(got.shape(), (Shape{B, n, 67}));
    EXPECT_TRUE(test::close(got, full.narrow(1, p, n), 1e-5, 1e-5)) << "positions " << p << ".." << p + n - 1;
    p += n;
  }
  EXPECT_EQ(cache.size(), T);
  EXPECT_THROW(models::forward_cached(model, all.narrow(1, 0, 1).contiguous(), cache), Error);
}

TEST(GptGenerate, CachedLogitsEqualTheFullForward) {
  expect_cached_logits_equal_full_forward(*models::gpt(test::tiny_gpt_config(67), 7));
}

TEST(LlamaGenerate, CachedLogitsEqualTheFullForward) {
  expect_cached_logits_equal_full_forward(*models::llama(test::tiny_llama_config(67), 7));  // GQA: 4 heads, 2 kv
  expect_cached_logits_equal_full_forward(*models::llama(test::tiny_llama_config(67, 4, /*tied=*/false), 8));
}

// Hugging Face's options in the cached path: rope scaling at the cache positions, biases, a head size of its own,
// and sliding windows of 3 keys (every block of the sequence longer than it: masks and keys dropped) and of 4.
TEST(LlamaGenerate, CachedLogitsEqualTheFullForwardWithHuggingFaceOptions) {
  for (int64_t window : {3, 4, 0}) {
    SCOPED_TRACE(window);
    models::LlamaConfig c = test::tiny_llama_config(67);
    c.head_dim = 16, c.attention_bias = true, c.mlp_bias = true, c.rope_theta = 500000, c.sliding_window = window;
    c.rope_scaling = {F::RopeScaling::Type::Llama3, 8.0, 1.0, 4.0, 64};
    auto model = models::llama(c, 9);
    {
      Generator gen(4);
      NoGradGuard no_grad;
      for (auto& [name, p] : model->named_parameters())
        if (name.ends_with(".bias")) p.copy_(normal(p.shape(), 0.0, 0.5, DType::Float32, &gen));
    }
    expect_cached_logits_equal_full_forward(*model);
  }
  EXPECT_TRUE(
      test::bit_equal(models::causal_mask(2, 5, 3), tensor({0, 1, 1, 1, 0, 0, 0, 1, 1, 1}, Shape{2, 5}, DType::Bool)));
}

// forward_runs: a trunk continuing 3 cached positions and branches after it (two from its end, one from its middle),
// then branches alone after the trunk kept in the cache: each run's logits those of a full forward over its own
// sequence (the prefix it reads, then its tokens).
void expect_runs_equal_full_forwards(models::LanguageModel& model) {
  const std::vector<int64_t> base = random_tokens(7, 67, 5), a = random_tokens(3, 67, 6), b = random_tokens(2, 67, 7),
                             c = random_tokens(2, 67, 8), d = random_tokens(4, 67, 9);
  auto full = [&](int64_t prefix, const std::vector<int64_t>& run) {  // its tokens' logits (1, len, 67)
    std::vector<int64_t> seq(base.begin(), base.begin() + prefix);
    seq.insert(seq.end(), run.begin(), run.end());
    NoGradGuard no_grad;
    return model(ids(seq)).narrow(1, prefix, static_cast<int64_t>(run.size()));
  };
  models::KVCache cache(model);
  models::forward_cached(model, ids({base.begin(), base.begin() + 3}), cache);
  std::vector<int64_t> tokens(base.begin() + 3, base.end());
  for (const auto* run : {&a, &b, &c}) tokens.insert(tokens.end(), run->begin(), run->end());
  const std::vector<models::TokenRun> runs = {{4, 3}, {3, 7}, {2, 7}, {2, 5}};
  const Tensor got = models::forward_runs(model, ids(tokens), cache, runs, /*first=*/2, /*keep_first=*/true);
  ASSERT_EQ(got.shape(), (Shape{1, 9, 67}));
  EXPECT_TRUE(test::close(got.narrow(1, 0, 2), full(3, {base.begin() + 3, base.end()}).narrow(1, 2, 2), 1e-5, 1e-5));
  EXPECT_TRUE(test::close(got.narrow(1, 2, 3), full(7, a), 1e-5, 1e-5));
  EXPECT_TRUE(test::close(got.narrow(1, 5, 2), full(7, b), 1e-5, 1e-5));
  EXPECT_TRUE(test::close(got.narrow(1, 7, 2), full(5, c), 1e-5, 1e-5));
  EXPECT_EQ(cache.size(), 7);  // the trunk kept, the branches dropped
  std::vector<int64_t> after = d;
  after.insert(after.end(), a.begin(), a.end());
  const Tensor more = models::forward_runs(model, ids(after), cache, {{4, 7}, {3, 7}}, 0, /*keep_first=*/false);
  EXPECT_TRUE(test::close(more.narrow(1, 0, 4), full(7, d), 1e-5, 1e-5));
  EXPECT_TRUE(test::close(more.narrow(1, 4, 3), full(7, a), 1e-5, 1e-5));
  EXPECT_EQ(cache.size(), 7);
  // A run reading slots not yet written, a kept first run not continuing the cache, lengths not the tokens'.
  EXPECT_THROW(models::forward_runs(model, ids(b), cache, {{1, 7}, {1, 9}}, 0, false), Error);
  EXPECT_THROW(models::forward_runs(model, ids(b), cache, {{2, 6}}, 0, true), Error);
  EXPECT_THROW(models::forward_runs(model, ids(b), cache, {{1, 7}}, 0, false), Error);
}

TEST(GptGenerate, RunsAfterASharedPrefixEqualTheirFullForwards) {
  expect_runs_equal_full_forwards(*models::gpt(test::tiny_gpt_config(67), 7));
}

// Llama's rotary positions per run, with grouped-query attention; a sliding window of 3 (every branch's window
// passing into the prefix) and of 4.
TEST(LlamaGenerate, RunsAfterASharedPrefixEqualTheirFullForwards) {
  expect_runs_equal_full_forwards(*models::llama(test::tiny_llama_config(67), 7));
  for (int64_t window : {3, 4}) {
    SCOPED_TRACE(window);
    models::LlamaConfig c = test::tiny_llama_config(67);
    c.sliding_window = window;
    expect_runs_equal_full_forwards(*models::llama(c, 9));
  }
}

// Greedy generation from a 67-token vocabulary, block 16, against the argmax of full forwards over each window.
// Weights `scale` x the init: a model whose greedy choice depends on the context instead of settling into a loop.
void expect_greedy_is_argmax_of_full_forwards(models::LanguageModel& model, double scale) {
  {
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters())
      if (p.dim() == 2) p.mul_(scale);
  }
  const std::vector<int64_t> prompt = random_tokens(3, 67, 4);
  const int64_t T = 16, new_tokens = 40;  // Cached: the window is rebuilt twice
  std::vector<std::vector<int64_t>> outputs;
  for (models::Window window : {models::Window::Sliding, models::Window::Cached}) {
    const std::vector<int64_t> got = models::generate(model, prompt, new_tokens, /*temperature=*/0.0, 0, 0, window);
    std::vector<int64_t> want = prompt;
    size_t start = 0;
    for (int64_t i = 0; i < new_tokens; ++i) {
      const std::vector<double> l = full_last_logits(model, want, start);
      want.push_back(std::max_element(l.begin(), l.end()) - l.begin());
      start = next_start(want, start, T, window);
    }
    EXPECT_EQ(got, want);
    // Not a constant sequence: the comparison says something.
    EXPECT_GT(std::set<int64_t>(got.begin() + 3, got.end()).size(), 2u);
    outputs.push_back(got);
  }
  // The same while the text fits the block (3 + 13 tokens), different past it.
  EXPECT_TRUE(std::equal(outputs[0].begin(), outputs[0].begin() + T, outputs[1].begin()));
  EXPECT_NE(outputs[0], outputs[1]);
}

TEST(GptGenerate, GreedyIsTheArgmaxOfFullForwardsAlsoPastTheBlockSize) {
  expect_greedy_is_argmax_of_full_forwards(*models::gpt(test::tiny_gpt_config(67), 8), 5.0);
}

TEST(LlamaGenerate, GreedyIsTheArgmaxOfFullForwardsAlsoPastTheBlockSize) {
  expect_greedy_is_argmax_of_full_forwards(*models::llama(test::tiny_llama_config(67, 2, /*tied=*/false), 8), 10.0);
}

TEST(GptGenerate, SeededSamplingIsReproducibleAndTopKHolds) {
  auto model = models::gpt(test::tiny_gpt_config(67), 9);
  const std::vector<int64_t> prompt = random_tokens(2, 67, 5);
  const auto a = models::generate(*model, prompt, 14, 1.0, 0, /*seed=*/1);
  EXPECT_EQ(a, models::generate(*model, prompt, 14, 1.0, 0, 1));
  EXPECT_NE(a, models::generate(*model, prompt, 14, 1.0, 0, 2));
  // top_k 1 is greedy at any temperature.
  EXPECT_EQ(models::generate(*model, prompt, 14, 2.0, 1, 3), models::generate(*model, prompt, 14, 0.0));
  // top_k 3 at a high temperature: every drawn token is among the 3 largest logits of a full forward.
  const auto s = models::generate(*model, prompt, 14, 5.0, 3, 4);
  int64_t not_argmax = 0;
  for (size_t i = prompt.size(); i < s.size(); ++i) {
    std::vector<double> l = full_last_logits(*model, std::vector<int64_t>(s.begin(), s.begin() + i), 0);
    std::vector<double> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    EXPECT_GE(l[s[i]], sorted[2]) << "token " << i;
    not_argmax += l[s[i]] < sorted[0];
  }
  EXPECT_GT(not_argmax, 0);  // the temperature made the draws differ from greedy
}

TEST(GptGenerate, PaddingTokensAreNeverDrawn) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  c.vocab_size = 128, c.real_vocab_size = 101;
  auto model = models::gpt(c, 10);
  {
    // Padding rows pointing along ln_f's (large) bias: their logits dominate every position.
    NoGradGuard no_grad;
    model->ln_f->bias.narrow(0, 0, 1).fill_(5.0);
    model->wte->weight.narrow(0, 101, 27).narrow(1, 0, 1).fill_(10.0);
  }
  const std::vector<int64_t> prompt = random_tokens(4, 101, 6);
  EXPECT_EQ(full_last_logits(*model, prompt, 0).size(), 101u);  // forward: the real vocabulary's logits
  models::KVCache cache(*model);
  const Tensor all = models::forward_cached(*model, ids(prompt), cache);  // (1, 4, 128): lm_head's every row
  const std::vector<double> l = all.select(1, 3).select(0, 0).to_vector<double>();
  ASSERT_GE(std::max_element(l.begin(), l.end()) - l.begin(), 101);  // an argmax over all rows would pick padding
  for (models::Window window : {models::Window::Sliding, models::Window::Cached})
    for (double temperature : {0.0, 1.0, 3.0})
      for (int64_t t : models::generate(*model, prompt, 20, temperature, 0, 1, window))
        EXPECT_LT(t, 101) << temperature;
}

// Temperatures below kMinTemperature are greedy (a subnormal one such as 1e-310 used to overflow the logits to
// infinity and draw from NaN probabilities), and NaN or infinite weights are a castor::Error, never an invalid id.
TEST(GptGenerate, TinyTemperaturesAreGreedyAndNonFiniteLogitsAreErrors) {
  auto model = models::gpt(test::tiny_gpt_config(67), 12);
  const std::vector<int64_t> prompt = random_tokens(3, 67, 7);
  const auto greedy = models::generate(*model, prompt, 12, 0.0);
  for (double t : {1e-310, 4.9e-324, 1e-200, 0.5 * models::kMinTemperature})
    EXPECT_EQ(models::generate(*model, prompt, 12, t, 0, 1), greedy) << t;
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    auto broken = models::gpt(test::tiny_gpt_config(67), 12);
    {
      NoGradGuard no_grad;
      broken->ln_f->weight.narrow(0, 0, 1).fill_(bad);
    }
    for (double t : {0.0, 1.0})
      test::expect_error([&] { models::generate(*broken, prompt, 4, t, 0, 1); }, {"generate: the logit of token"});
  }
}

// The streaming form emits what the vector form returns, token by token, also past several cache rebuilds.
TEST(GptGenerate, StreamingEmitsTheSameTokens) {
  auto model = models::gpt(test::tiny_gpt_config(67), 13);
  const std::vector<int64_t> prompt = random_tokens(5, 67, 8);
  const int64_t n = 5 * model->config().block_size;
  for (models::Window window : {models::Window::Sliding, models::Window::Cached}) {
    std::vector<int64_t> streamed = prompt;
    models::generate(*model, prompt, n, 0.9, 10, 3, window, [&](int64_t t) {
      streamed.push_back(t);
      return true;
    });
    EXPECT_EQ(streamed, models::generate(*model, prompt, n, 0.9, 10, 3, window));
  }
}

// A model of a long context (a Llama 3's 131,072 positions; here 2^20) generating a few tokens: the KV cache holds
// the prompt and the new tokens, not the whole context (2 layers x keys and values x 2 kv heads x 2^20 x 8 floats:
// 256 MiB), and the tokens are those of the same weights with a context of 16.
TEST(LlamaGenerate, TheCacheHoldsWhatTheGenerationNeedsNotTheWholeContext) {
  models::LlamaConfig c = test::tiny_llama_config(61);
  auto short_context = models::llama(c, 5);
  c.max_seq_len = int64_t{1} << 20;
  auto long_context = models::llama(c, 5);
  const std::vector<int64_t> prompt = random_tokens(5, 61, 2);
  reset_peak_memory_stats();
  const int64_t before = memory_stats().current_bytes;
  const std::vector<int64_t> tokens = models::generate(*long_context, prompt, 8, 0.0);
  EXPECT_LT(memory_stats().peak_bytes - before, int64_t{1} << 20);
  EXPECT_EQ(tokens, models::generate(*short_context, prompt, 8, 0.0));
  models::KVCache full(*short_context, 1, 100);  // (at most the block size)
  EXPECT_EQ(full.capacity(), 16);
}

TEST(GptGenerate, BadArgumentsAreErrors) {
  auto model = models::gpt(test::tiny_gpt_config(67), 11);
  EXPECT_THROW(models::generate(*model, {}, 5), Error);
  EXPECT_THROW(models::generate(*model, {67}, 5), Error);
  EXPECT_THROW(models::generate(*model, {1}, 5, -1.0), Error);
  EXPECT_THROW(models::generate(*model, {1}, 5, 1.0, -2), Error);
  EXPECT_EQ(models::generate(*model, {1, 2}, 0), (std::vector<int64_t>{1, 2}));
}

}  // namespace
// run.c's sample_topp by hand: probabilities 0.5 0.3 0.15 0.05 (logits their logs, temperature 1). top_p 0.7: the
// cutoff (1 - 0.7) / 3 = 0.1 keeps three, the cumulative 0.5, 0.8 passes 0.7 at the second, so only tokens 0 and 1
// are drawn, in ratio 0.5 : 0.3; top_p 0.9 adds token 2 (0.95 > 0.9), never 3; top_p 1 (off) draws all four.
TEST(GptGenerate, TopPIsRunCsNucleusSampling) {
  const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
  for (const auto& [p, want] : {std::pair{0.7, std::vector<double>{0.625, 0.375, 0, 0}},
                                std::pair{0.9, std::vector<double>{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
                                std::pair{1.0, std::vector<double>{0.5, 0.3, 0.15, 0.05}}}) {
    Generator gen(7);
    std::vector<double> seen(4, 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) seen[static_cast<size_t>(models::sample_token(logits, 1.0, 0, p, gen))] += 1.0 / n;
    for (size_t k = 0; k < 4; ++k) {
      if (want[k] == 0)
        EXPECT_EQ(seen[k], 0) << "top_p " << p << " token " << k;
      else
        EXPECT_NEAR(seen[k], want[k], 0.01) << "top_p " << p << " token " << k;
    }
  }
  // Greedy ignores top_p; top-k runs first (k 1: the argmax whatever p).
  Generator gen(1);
  EXPECT_EQ(models::sample_token(logits, 0.0, 0, 0.5, gen), 0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(models::sample_token(logits, 1.0, 1, 0.9, gen), 0);
}

}  // namespace castor
