// The GPT model against its PyTorch twin (tests/oracle/gpt_oracle.py, nanoGPT's architecture) from the same
// safetensors weights on the same token batches: loss, logits and every gradient; AdamW training curves.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "castor/amp.h"
#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "nn/lm_twin.h"
#include "nn/tiny_gpt.h"
#include "test_util.h"

namespace castor {
namespace {

using test::random_token_batch;

// Runs the twin (tests/oracle/gpt_oracle.py) from the model's weights on `batch`.
StateDict run_twin(const std::string& mode, const std::string& name, const std::string& config, models::GPT& model,
                   const StateDict& batch) {
  return test::run_lm_twin("gpt_oracle.py", mode, name, config, model, batch);
}

TEST(Gpt, NamesAreNanoGptsAndTheHeadIsTied) {
  auto model = models::gpt(test::tiny_gpt_config(67));
  const StateDict sd = model->state_dict();
  for (const char* key :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias", "transformer.h.0.mlp.c_fc.weight",
        "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.bias", "lm_head.weight"})
    EXPECT_TRUE(sd.count(key)) << key;
  EXPECT_TRUE(model->lm_head->weight.is_same(model->wte->weight));
  // Listed once by parameters(), under wte's name (nanoGPT's named_parameters).
  int64_t tied = 0;
  for (const auto& [name, p] : model->named_parameters()) tied += p.is_same(model->wte->weight);
  EXPECT_EQ(tied, 1);
  EXPECT_EQ(model->named_parameters()[0].first, "transformer.wte.weight");
  // A state dict without lm_head.weight loads strictly (the tie fills it).
  StateDict without = sd;
  without.erase("lm_head.weight");
  EXPECT_NO_THROW(model->load_state_dict(without));
}

// forward takes (B, T) int64 token ids, T at most the block size; anything else is an error saying what is wrong.
TEST(Gpt, ForwardRefusesBadTokenBatches) {
  auto model = models::gpt(test::tiny_gpt_config(67));
  EXPECT_EQ((*model)(zeros({2, 16}, DType::Int64)).shape(), (Shape{2, 16, 67}));
  const Tensor too_long = zeros({1, 17}, DType::Int64);
  test::expect_error([&] { (*model)(too_long); },
                     {"GPT: cannot forward a sequence of length 17, block size is only 16"});
  for (const Tensor& bad : {zeros({1, 4}, DType::Float32), zeros({4}, DType::Int64)})
    test::expect_error([&] { (*model)(bad); }, {"GPT: expected (B, T) int64 token ids"});
}

TEST(Gpt, Gpt2InitStatistics) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  c.n_layer = 4, c.n_embd = 64, c.vocab_size = 512;
  auto model = models::gpt(c);
  auto stdev = [](const Tensor& t) {
    const auto v = t.to_vector<double>();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / v.size());
  };
  EXPECT_NEAR(stdev(model->wte->weight), 0.02, 0.002);
  const auto& block = dynamic_cast<models::Block&>(*(*model->h)[3]);
  EXPECT_NEAR(stdev(block.attn->c_proj->weight), 0.02 / std::sqrt(8.0), 0.003);
  EXPECT_NEAR(stdev(block.mlp->c_fc->weight), 0.02, 0.002);
  EXPECT_EQ(stdev(block.mlp->c_fc->bias), 0.0);
  EXPECT_EQ(block.ln_1->weight.to_vector<double>(), std::vector<double>(64, 1.0));
}

// GPT skips its layers' PyTorch-style init (nn::SkipInitGuard) and draws GPT-2's in place: the weights are those
// drawn by normal() in named_parameters order, and the default generator ends where the layers' init leaves it.
TEST(Gpt, InitDrawsGpt2sWeightsAndAdvancesTheDefaultGeneratorAsItsLayers) {
  const models::GPTConfig c = test::tiny_gpt_config(67);
  manual_seed(21);
  auto model = models::gpt(c, /*seed=*/5);
  const Generator::State after = default_generator().state();
  manual_seed(21);
  const nn::Embedding wte(c.vocab_size, c.n_embd), wpe(c.block_size, c.n_embd);  // GPT's layers in its order
  for (int64_t l = 0; l < c.n_layer; ++l) const models::Block block(c);
  const nn::Linear lm_head(c.n_embd, c.vocab_size, /*bias=*/false);
  EXPECT_EQ(default_generator().state(), after);
  Generator gen(5);
  for (const auto& [name, p] : model->named_parameters()) {
    const bool norm = name.find(".ln_") != std::string::npos, bias = name.ends_with("bias");
    const double std = name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
    const Tensor want = norm   ? full(p.shape(), bias ? 0.0 : 1.0)
                        : bias ? zeros(p.shape())
                               : normal(p.shape(), 0.0, std, DType::Float32, &gen);
    EXPECT_TRUE(test::bit_equal(p, want)) << name;
  }
}

// O0: loss within 1e-5 relative, logits within 1e-4, every gradient within 1e-4 relative L2 of PyTorch.
TEST(Gpt, Float32MatchesPyTorch) {
  for (bool bias : {true, false}) {
    models::GPTConfig c = test::tiny_gpt_config(67);
    c.bias = bias;
    auto model = models::gpt(c, 3);
    const Tensor x = random_token_batch(3, 16, c.vocab_size, 1), y = random_token_batch(3, 16, c.vocab_size, 2);
    const StateDict want = run_twin("grads", "gpt_f32", test::gpt_config_json(c), *model, {{"x", x}, {"y", y}});
    ASSERT_FALSE(want.empty());
    const Tensor logits = (*model)(x);
    const Tensor loss = F::cross_entropy(logits.reshape({-1, c.vocab_size}), y.reshape({-1}));
    loss.backward();
    EXPECT_NEAR(loss.item(), want.at("loss").item(), 1e-5 * want.at("loss").item());
    EXPECT_TRUE(test::close(logits, want.at("logits"), 1e-4, 1e-5));
    test::expect_grads_match(*model, want, 1e-4);
  }
}

// O1 bf16: autocast on both sides. PyTorch's CPU autocast runs the attention softmax in bfloat16 and Castor's fused
// attention keeps its statistics in float32, so they agree to bf16 tolerance, not bit for bit.
TEST(Gpt, AutocastBFloat16MatchesPyTorchAutocast) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  auto model = models::gpt(c, 4);
  const Tensor x = random_token_batch(3, 16, c.vocab_size, 5), y = random_token_batch(3, 16, c.vocab_size, 6);
  const StateDict want = run_twin("grads", "gpt_bf16", test::gpt_config_json(c, ", \"autocast\": \"bf16\""), *model,
                                  {{"x", x}, {"y", y}});
  ASSERT_FALSE(want.empty());
  Tensor loss;
  {
    castor::amp::AutocastGuard autocast(DType::BFloat16);
    loss = test::lm_loss(*model, x, y);
  }
  loss.backward();
  EXPECT_EQ(loss.dtype(), DType::Float32);
  EXPECT_NEAR(loss.item(), want.at("loss").item(), 1e-2 * want.at("loss").item());
  test::expect_grads_match(*model, want, 5e-2);
}

}  // namespace
}  // namespace castor
