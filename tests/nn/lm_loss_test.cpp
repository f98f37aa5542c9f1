// F::linear_cross_entropy and the language models' chunked loss (lm_loss) and evaluation (lm_scores) against the
// unchunked path they replace, F::cross_entropy of F::linear's logits (both parity-tested against PyTorch 1.13):
// loss and gradients within 1e-6 in float32, GPT (tied, padded vocabulary) and Llama (tied and untied); a quantized
// output layer's chunks under recompute against the plain logits path, and their memory.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "castor/allocator.h"
#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/llama.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/quant.h"
#include "castor/random.h"
#include "nn/lora_twin.h"
#include "nn/tiny_gpt.h"
#include "nn/tiny_llama.h"

namespace castor {
namespace {

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  EXPECT_LE(worst, tol) << what;
}

struct Result {
  Tensor loss, dx, dw;
};

Result run(bool chunked, const Tensor& x0, const Tensor& w0, const Tensor& t, F::Reduction r, double smoothing,
           int64_t classes, int64_t chunk) {
  const Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true);
  Tensor loss = chunked ? F::linear_cross_entropy(x, w, t, r, smoothing, -100, classes, chunk)
                        : F::cross_entropy(F::linear(x, w).narrow(1, 0, classes), t, r, smoothing);
  (r == F::Reduction::None ? sum(loss * arange(t.numel()).to(DType::Float32)) : loss).backward();
  return {loss.detach(), x.grad(), w.grad()};
}

// Chunks of one row and one class, a few rows, and all of them; a padded head (classes < V); label smoothing,
// ignored targets, each reduction.
TEST(LinearCrossEntropy, MatchesLinearThenCrossEntropy) {
  Generator gen(11);
  const int64_t N = 37, C = 16, V = 50;
  const Tensor x = randn({N, C}, DType::Float32, &gen), w = randn({V, C}, DType::Float32, &gen) * 0.3;
  std::vector<double> tv;
  for (int64_t i = 0; i < N; ++i) tv.push_back(i % 9 == 4 ? -100 : static_cast<double>((i * 7) % 45));
  const Tensor t = tensor(tv, {N}, DType::Int64);
  for (int64_t classes : {V, int64_t{45}})
    for (int64_t chunk : {int64_t{1}, int64_t{300}, int64_t{1} << 22})
      for (double smoothing : {0.0, 0.1})
        for (F::Reduction r : {F::Reduction::Mean, F::Reduction::Sum, F::Reduction::None}) {
          if (smoothing > 0 && r == F::Reduction::Mean) continue;  // with ignored targets: refused (below)
          const std::string what = detail::cat("classes ", classes, " chunk ", chunk, " smoothing ", smoothing,
                                               " reduction ", static_cast<int>(r));
          const Result a = run(true, x, w, t, r, smoothing, classes, chunk);
          const Result b = run(false, x, w, t, r, smoothing, classes, chunk);
          expect_close(a.loss, b.loss, 1e-6 * (r == F::Reduction::Mean ? 1 : N), what + " loss");
          expect_close(a.dx, b.dx, 1e-6 * (r == F::Reduction::None ? N : 1), what + " dx");
          expect_close(a.dw, b.dw, 1e-6 * (r == F::Reduction::None ? N : 1), what + " dw");
        }
  EXPECT_THROW(F::linear_cross_entropy(x, w, t, F::Reduction::Mean, 0.1), Error);
  EXPECT_THROW(F::linear_cross_entropy(x, w, tensor({49.0}, {1}, DType::Int64).expand({N}).contiguous(),
                                       F::Reduction::Mean, 0, -100, 45),
               Error);  // a target past the classes
}

// Under autocast linear's policy and cross_entropy's: the logits rounded to bfloat16 once, the loss float32 and the
// float32 leaves' gradients float32, as the two ops give them (within a bfloat16 rounding of the input's gradient).
TEST(LinearCrossEntropy, AutocastKeepsLinearAndCrossEntropyPolicies) {
  Generator gen(12);
  const Tensor x = randn({24, 16}, DType::Float32, &gen), w = randn({40, 16}, DType::Float32, &gen) * 0.3;
  const Tensor t = randint(0, 40, {24}, &gen);
  Result a, b;
  {
    amp::AutocastGuard autocast(DType::BFloat16);
    a = run(true, x, w, t, F::Reduction::Mean, 0.0, 40, 100);
  }
  {
    amp::AutocastGuard autocast(DType::BFloat16);
    b = run(false, x, w, t, F::Reduction::Mean, 0.0, 40, 100);
  }
  EXPECT_EQ(a.loss.dtype(), DType::Float32);
  EXPECT_EQ(a.dx.dtype(), DType::Float32);
  EXPECT_EQ(a.dw.dtype(), DType::Float32);
  expect_close(a.loss, b.loss, 1e-6, "loss");
  for (const auto& [got, want] : {std::pair{a.dx, b.dx}, std::pair{a.dw, b.dw}}) {
    const auto g = got.to_vector<double>(), h = want.to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], h[i], std::abs(h[i]) / 128 + 1e-9) << i;  // a bf16 ulp
  }
}

std::vector<Tensor> grads_of(const nn::Module& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad());
  return g;
}

// lm_loss against cross_entropy of forward's logits, and lm_scores against the logits' sum and argmax.
void check_model(models::LanguageModel& model, const std::string& what) {
  Generator gen(13);
  const Tensor idx = randint(0, model.vocab_size(), {3, 10}, &gen),
               target = randint(0, model.vocab_size(), {3, 10}, &gen);
  const Tensor chunked = models::lm_loss(model, idx, target, F::Reduction::Mean, 0.1);
  chunked.backward();
  const std::vector<Tensor> g1 = grads_of(model);
  for (const Tensor& p : model.parameters()) Tensor(p).set_grad(Tensor());
  const Tensor logits = model(idx);
  const Tensor plain = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}), F::Reduction::Mean,
                                        0.1);
  plain.backward();
  const std::vector<Tensor> g2 = grads_of(model);
  expect_close(chunked, plain, 1e-6, what + " loss");
  for (size_t i = 0; i < g1.size(); ++i) expect_close(g1[i], g2[i], 1e-6, what + " grad " + std::to_string(i));
  const models::LmScores s = models::lm_scores(model, idx, target);
  NoGradGuard no_grad;
  const Tensor flat = model(idx).reshape({-1, model.vocab_size()});
  EXPECT_NEAR(s.loss_sum, F::cross_entropy(flat, target.reshape({-1}), F::Reduction::Sum).item(), 1e-5) << what;
  EXPECT_EQ(s.predicted, argmax(flat, 1).to_vector<int64_t>()) << what;
}

TEST(LmLoss, GptAndLlamaTiedAndUntiedMatchTheLogitsPath) {
  models::GPTConfig gc = test::tiny_gpt_config(64);
  gc.real_vocab_size = 57;  // a padded head: the loss over the real vocabulary only
  auto gpt = models::gpt(gc, 3);
  check_model(*gpt, "gpt");
  for (bool tied : {true, false}) {
    auto llama = models::llama(test::tiny_llama_config(48, 2, tied), 4);
    check_model(*llama, tied ? "llama tied" : "llama untied");
  }
}

// A QLoRA-style Llama: every Linear, the output layer too, in q8_0 blocks, adapters on every Linear but the output,
// blocks recomputed, a vocabulary of 2^16 and some targets ignored. Under a mean with label smoothing (which
// linear_cross_entropy refuses with ignored targets) lm_loss computes 64 rows of logits at a time, each chunk under
// nn::checkpoint (4 chunks of the 256 rows here); otherwise (a mean without smoothing, a sum with it) linear_cross_
// entropy's two passes over the output layer's blocks, dequantized a block of classes at a time. Each way its loss and
// the adapters' gradients equal cross_entropy of forward's logits without recompute within 1e-5 (float32), and the
// allocator's peak over the loss's forward and backward stays under what the 256 rows' float32 logits alone take (the
// plain path holds them, their softmax and their gradient).
TEST(LmLoss, QuantizedHeadIsChunkedUnderRecomputeAndMatchesTheLogitsPath) {
  models::LlamaConfig c = test::tiny_llama_config(1 << 16, 2, /*tied=*/false);
  c.max_seq_len = 64;
  auto model = models::llama(c, 5);
  for (const auto& [path, layer] : nn::linear_layers(*model)) layer->quantize_weight(quant::BlockType::Q8_0, false);
  nn::apply_lora(*model, nn::LoraConfig{.r = 4, .alpha = 8});
  test::randomize_lora_b(*model, 6);
  Generator gen(17);
  const Tensor idx = randint(0, c.vocab_size, {4, 64}, &gen);
  Tensor target = randint(0, c.vocab_size, {4, 64}, &gen);
  target.narrow(1, 0, 5).fill_(-100);
  const int64_t logits_bytes = idx.numel() * c.vocab_size * 4;
  for (auto [reduction, smoothing] :
       {std::pair{F::Reduction::Mean, 0.1}, std::pair{F::Reduction::Mean, 0.0}, std::pair{F::Reduction::Sum, 0.1}}) {
    const std::string what = std::string(reduction == F::Reduction::Mean ? "mean" : "sum") + " smoothing " +
                             std::to_string(smoothing);
    model->set_recompute(true);
    empty_cache();
    reset_peak_memory_stats();
    const int64_t before = memory_stats().current_bytes;
    const Tensor chunked = models::lm_loss(*model, idx, target, reduction, smoothing);
    chunked.backward();
    const int64_t peak = memory_stats().peak_bytes - before;
    const std::vector<Tensor> g1 = grads_of(*model);
    for (const Tensor& p : model->parameters()) Tensor(p).set_grad(Tensor());

    model->set_recompute(false);
    const Tensor logits = model->forward(idx);
    const Tensor plain = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}), reduction,
                                          smoothing, /*ignore_index=*/-100);
    plain.backward();
    const std::vector<Tensor> g2 = grads_of(*model);
    for (const Tensor& p : model->parameters()) Tensor(p).set_grad(Tensor());
    expect_close(chunked, plain, 1e-5, what + " loss");
    int adapters = 0;  // (the frozen norms and embedding have none)
    for (size_t i = 0; i < g1.size(); ++i) {
      ASSERT_EQ(g1[i].defined(), g2[i].defined()) << what << " " << i;
      if (g1[i].defined()) expect_close(g1[i], g2[i], 1e-5, what + " grad " + std::to_string(i)), ++adapters;
    }
    EXPECT_EQ(adapters, 28) << what;  // (A and B of 14 adapters)
    EXPECT_LT(peak, logits_bytes) << what << ": peak " << peak << " bytes over the loss, float32 logits "
                                  << logits_bytes;
  }
}

}  // namespace
}  // namespace castor
