// nn::checkpoint and the language models' --recompute blocks: gradients bit-equal to the run without recompute (the
// oracle: the same model run plainly, as torch.utils.checkpoint promises), at O0, O1 bf16 and O1 fp16 with loss
// scaling, dropout on, over two AdamW steps (the plain run's second forward takes the optimizer's kept 16-bit weights;
// the recomputed run, as castor train runs it, keeps none and casts afresh); and the allocator's peak lower.
#include <gtest/gtest.h>

#include <cstring>

#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/grad_scaler.h"
#include "castor/llama.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "nn/tiny_gpt.h"
#include "nn/tiny_llama.h"

namespace castor {
namespace {

enum class Mode { O0, Bf16, Fp16Scaled };

std::shared_ptr<models::LanguageModel> make_model(bool llama, double dropout) {
  if (llama) {
    models::LlamaConfig c = test::tiny_llama_config(40);
    c.dropout = dropout;
    return models::llama(c, 7);
  }
  models::GPTConfig c = test::tiny_gpt_config(40);
  c.dropout = dropout;
  return models::gpt(c, 7);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
}

// Two AdamW steps of a tiny model on fixed tokens; each step's parameter gradients (as backward left them: scaled
// under fp16) and losses, in named_parameters order, and the bytes held after the last step. With recompute the
// optimizer keeps no 16-bit copies of the weights (castor train's apply_recompute).
struct Trace {
  std::vector<std::vector<Tensor>> grads;
  std::vector<double> losses;
  int64_t held_after = 0;
};

Trace train(bool llama, Mode mode, bool recompute) {
  const int64_t before = memory_stats().current_bytes;
  auto model = make_model(llama, /*dropout=*/0.2);
  model->set_recompute(recompute);
  model->train();
  auto opt = optim::make_adamw(model->parameters(), optim::AdamOptions::adamw());
  opt->set_keep_casts(!recompute);
  amp::GradScaler scaler(amp::GradScalerOptions{.enabled = mode == Mode::Fp16Scaled});
  Generator data(3);
  const Tensor idx = randint(0, 40, {2, 12}, &data), target = randint(0, 40, {2, 12}, &data);
  Trace trace;
  for (int step = 0; step < 2; ++step) {
    opt->zero_grad();
    manual_seed(100 + step);  // the dropout masks
    Tensor loss;
    {
      amp::AutocastGuard autocast(mode == Mode::Fp16Scaled ? DType::Float16 : DType::BFloat16, mode != Mode::O0);
      const Tensor logits = (*model)(idx);
      loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
    }
    scaler.scale(loss).backward();
    std::vector<Tensor> grads;
    for (const Tensor& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
    trace.grads.push_back(grads);
    trace.losses.push_back(loss.item());
    scaler.step(*opt);
    scaler.update();
  }
  opt->zero_grad(/*set_to_none=*/true);
  trace.held_after = memory_stats().current_bytes - before;
  return trace;
}

class Recompute : public ::testing::TestWithParam<std::tuple<bool, Mode>> {};

TEST_P(Recompute, GradientsBitEqualTheRunWithout) {
  const auto [llama, mode] = GetParam();
  const Trace plain = train(llama, mode, false), recomputed = train(llama, mode, true);
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    EXPECT_EQ(plain.losses[s], recomputed.losses[s]) << "step " << s;
    for (size_t i = 0; i < plain.grads[s].size(); ++i) {
      ASSERT_TRUE(plain.grads[s][i].defined()) << "step " << s << " param " << i;
      EXPECT_TRUE(same_bits(plain.grads[s][i], recomputed.grads[s][i])) << "step " << s << " param " << i;
    }
  }
  // Without kept copies the run holds 2 bytes less for each weight autocast casts (the matrices: most parameters);
  // at O0 nothing is cast. (Within 2% of the matrices' bytes: a few small tensors, such as rotary tables, differ.)
  int64_t matrices = 0;
  for (const Tensor& p : make_model(llama, 0.2)->parameters())
    if (p.dim() == 2) matrices += p.numel();
  const double freed = static_cast<double>(plain.held_after - recomputed.held_after), slack = 0.04 * matrices;
  if (mode == Mode::O0) {
    EXPECT_NEAR(freed, 0.0, slack);
  } else {
    EXPECT_GE(freed, static_cast<double>(matrices)) << "(at least half the matrices' 2 bytes)";
    EXPECT_LE(freed, 2.0 * matrices + slack);
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<bool, Mode>>& info) {
  const char* modes[] = {"O0", "O1Bf16", "O1Fp16Scaled"};
  return std::string(std::get<0>(info.param) ? "Llama" : "Gpt") + modes[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(Modes, Recompute,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Mode::O0, Mode::Bf16, Mode::Fp16Scaled)),
                         case_name);

// Against float64 finite differences (PyTorch's gradcheck): checkpoint of a function with a parameter inside and
// two inputs, one of which needs no gradient.
TEST(ActivationCheckpoint, GradcheckInputsAndParameters) {
  Generator gen(5);
  const Tensor w = randn({3, 3}, DType::Float64, &gen).requires_grad_(true);
  const Tensor a = randn({2, 3}, DType::Float64, &gen).requires_grad_(true);
  const Tensor b = randn({2, 3}, DType::Float64, &gen);
  auto fn = [&](const std::vector<Tensor>& in) { return tanh(mm(in[0], w)) * in[1]; };
  const Tensor y = sum(nn::checkpoint(fn, {a, b}));
  y.backward();
  const double eps = 1e-6;
  auto numeric = [&](const Tensor& t, int64_t k) {
    NoGradGuard no_grad;
    double* p = static_cast<double*>(t.data_ptr()) + k;
    const double keep = *p;
    *p = keep + eps;
    const double up = sum(fn({a, b})).item();
    *p = keep - eps;
    const double down = sum(fn({a, b})).item();
    *p = keep;
    return (up - down) / (2 * eps);
  };
  for (const Tensor& t : {a, w}) {
    const std::vector<double> g = t.grad().to_vector<double>();
    for (int64_t k = 0; k < t.numel(); ++k) EXPECT_NEAR(g[k], numeric(t, k), 1e-7) << k;
  }
  EXPECT_FALSE(b.grad().defined());
}

// A parameter inside gets its gradient though no input requires grad (a LoRA run's frozen embedding output).
TEST(ActivationCheckpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  const Tensor w = full({2, 2}, 3.0).requires_grad_(true);
  const Tensor x = ones({1, 2});
  sum(nn::checkpoint([&](const std::vector<Tensor>& in) { return mm(in[0], w); }, {x})).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
}

// The generator is where the plain run would leave it after the recompute, and without grad mode nothing is kept.
TEST(ActivationCheckpoint, LeavesTheGeneratorAsThePlainRunDoes) {
  const Tensor x = ones({64}).requires_grad_(true);
  auto fn = [](const std::vector<Tensor>& in) { return F::dropout(in[0], 0.5, true); };
  manual_seed(9);
  const Tensor plain = fn({x});
  const uint64_t after_plain = default_generator().next_u64();
  manual_seed(9);
  const Tensor y = nn::checkpoint(fn, {x});
  sum(y).backward();
  EXPECT_EQ(default_generator().next_u64(), after_plain);
  EXPECT_TRUE(same_bits(x.grad(), plain.detach() / 1.0));  // d(sum dropout(x))/dx = mask / (1 - p) = dropout(ones)
}

// Only the blocks' inputs are kept: the allocator's peak over a forward and backward falls.
TEST(ActivationCheckpoint, RecomputeLowersThePeak) {
  auto peak = [](bool recompute) {
    models::GPTConfig c = test::tiny_gpt_config(64);
    c.n_layer = 6, c.block_size = 64;
    auto model = models::gpt(c, 1);
    model->set_recompute(recompute);
    Generator data(2);
    const Tensor idx = randint(0, 64, {4, 64}, &data);
    reset_peak_memory_stats();
    const int64_t base = memory_stats().current_bytes;
    const Tensor logits = (*model)(idx);
    F::cross_entropy(logits.reshape({-1, 64}), idx.reshape({-1})).backward();
    return memory_stats().peak_bytes - base;
  };
  const int64_t plain = peak(false), recomputed = peak(true);
  EXPECT_LT(recomputed, plain * 3 / 4) << plain << " vs " << recomputed;
}

}  // namespace
}  // namespace castor
