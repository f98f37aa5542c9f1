// LoRA adapters on GPT against PEFT's rules and a PyTorch 1.13 LoRA (tests/oracle/lora_oracle.py): the start equals
// the base, adapter gradients, bf16 autocast with a 16-bit frozen base, optimizer state, merge and unmerge, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "castor/amp.h"
#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/lora.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "nn/lm_twin.h"
#include "nn/lora_twin.h"
#include "nn/tiny_gpt.h"
#include "nn/tiny_llama.h"
#include "runtime/dispatch.h"
#include "support/support.h"
#include "test_util.h"

namespace castor {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Runs lora_oracle.py on the model's base and adapters (all float32 in the file) and the batch.
StateDict run_oracle(const std::string& name, const std::string& config, nn::Module& model, const StateDict& batch) {
  StateDict weights;
  for (const auto& [k, v] : model.state_dict()) weights.emplace(k, v.to(DType::Float32));
  return test::lora_oracle_grads(name, config, weights, batch);
}

TEST(Lora, PeftNamesShapesAndFrozenBase) {
  auto model = models::gpt(test::tiny_gpt_config(67), 3);
  nn::LoraConfig cfg;
  cfg.r = 4;
  cfg.target_modules = {"c_attn"};
  const auto paths = nn::apply_lora(*model, cfg);
  EXPECT_EQ(paths, (std::vector<std::string>{"transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"}));
  const StateDict sd = nn::lora_state_dict(*model);
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd.at("transformer.h.0.attn.c_attn.lora_A.weight").shape(), (Shape{4, 32}));
  EXPECT_EQ(sd.at("transformer.h.1.attn.c_attn.lora_B.weight").shape(), (Shape{96, 4}));
  EXPECT_TRUE(model->state_dict().count("transformer.h.0.attn.c_attn.weight"));  // the base keeps its names
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_EQ(p.requires_grad(), name.find(".lora_") != std::string::npos) << name;
  // A is nn.Linear's kaiming_uniform_(a=sqrt(5)): within +-1/sqrt(in); B starts at zero.
  for (double v : sd.at("transformer.h.0.attn.c_attn.lora_A.weight").to_vector<double>())
    EXPECT_LE(std::abs(v), 1.0 / std::sqrt(32.0));
  for (double v : sd.at("transformer.h.0.attn.c_attn.lora_B.weight").to_vector<double>()) EXPECT_EQ(v, 0.0);
  // all-linear: every Linear but the output layer (lm_head).
  auto all = models::gpt(test::tiny_gpt_config(67), 3);
  EXPECT_EQ(nn::apply_lora(*all, nn::LoraConfig{}).size(), 8u);
  EXPECT_FALSE(all->lm_head->lora);
  EXPECT_DOUBLE_EQ((nn::LoraConfig{.r = 16, .alpha = 32}).scaling(), 2.0);
  EXPECT_DOUBLE_EQ((nn::LoraConfig{.r = 16, .alpha = 32, .rslora = true}).scaling(), 8.0);
}

// Only dX flows through a frozen Linear: its backward runs one GEMM (diff_dst W), not the weight's (diff_dst^T x).
TEST(Lora, AFrozenLinearRunsNoWeightGradientGemm) {
  struct CountMm : OpObserver {
    int mm = 0;
    void on_op(const OpEvent& e) override { mm += e.op == OpKind::Mm; }
  };
  for (bool frozen : {false, true}) {
    nn::Linear layer(32, 64);
    if (frozen) layer.weight.requires_grad_(false), layer.bias.requires_grad_(false);
    Tensor x = randn({4, 8, 32});
    x.requires_grad_(true);
    const Tensor loss = sum(layer(x));
    CountMm count;
    set_op_observer(&count);
    loss.backward();
    set_op_observer(nullptr);
    EXPECT_EQ(count.mm, frozen ? 1 : 2);
    EXPECT_TRUE(x.grad().defined());
    EXPECT_EQ(layer.weight.grad().defined(), !frozen);
  }
}

TEST(Lora, AtInitLogitsEqualTheBaseBitForBit) {
  for (nn::LoraInit init : {nn::LoraInit::KaimingUniform, nn::LoraInit::Gaussian}) {
    std::shared_ptr<models::LanguageModel> bases[] = {models::gpt(test::tiny_gpt_config(67), 3),
                                                      std::make_shared<models::Llama>(test::tiny_llama_config(67), 3)};
    for (auto& model : bases) {
      const Tensor x = test::random_token_batch(2, 16, 67, 1);
      const Tensor base = (*model)(x).detach();
      Tensor base16;
      {
        amp::AutocastGuard autocast(DType::BFloat16);
        base16 = (*model)(x).detach();
      }
      nn::apply_lora(*model, nn::LoraConfig{.init = init});
      EXPECT_TRUE(same_bits((*model)(x), base)) << model->type_name();
      amp::AutocastGuard autocast(DType::BFloat16);
      EXPECT_TRUE(same_bits((*model)(x), base16)) << model->type_name();
    }
  }
}

TEST(Lora, AdapterGradientsMatchPyTorchFloat32) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  auto model = models::gpt(c, 3);
  nn::LoraConfig cfg{.r = 4, .alpha = 8, .target_modules = {"c_attn", "c_proj", "c_fc"}};
  nn::apply_lora(*model, cfg);
  test::randomize_lora_b(*model, 7);
  const Tensor x = test::random_token_batch(3, 16, c.vocab_size, 1),
               y = test::random_token_batch(3, 16, c.vocab_size, 2);
  const StateDict want = run_oracle("lora_f32", test::gpt_config_json(c, detail::cat(", \"scaling\": ", cfg.scaling())),
                                    *model, {{"x", x}, {"y", y}});
  ASSERT_FALSE(want.empty());
  const Tensor logits = (*model)(x);
  F::cross_entropy(logits.reshape({-1, c.vocab_size}), y.reshape({-1})).backward();
  EXPECT_TRUE(test::close(logits, want.at("logits"), 1e-5, 1e-6));
  test::expect_adapter_grads(*model, want, 1e-6);
}

// llama2.c's names: adapters on wq and wv of a grouped-query Llama (wk and wv are (16, 32) there, so rank 8 fits).
TEST(Lora, LlamaAdapterGradientsMatchPyTorchFloat32) {
  const models::LlamaConfig c = test::tiny_llama_config(67);
  models::Llama model(c, 3);
  nn::LoraConfig cfg{.r = 8, .alpha = 16, .target_modules = {"wq", "wv"}};
  EXPECT_EQ(nn::apply_lora(model, cfg).size(), 4u);
  test::randomize_lora_b(model, 7);
  const Tensor x = test::random_token_batch(3, 16, 67, 1), y = test::random_token_batch(3, 16, 67, 2);
  const StateDict want = run_oracle(
      "lora_llama_f32", test::llama_config_json(c, detail::cat(", \"model\": \"llama\", \"scaling\": ", cfg.scaling())),
      model, {{"x", x}, {"y", y}});
  ASSERT_FALSE(want.empty());
  const Tensor logits = model(x);
  F::cross_entropy(logits.reshape({-1, 67}), y.reshape({-1})).backward();
  EXPECT_TRUE(test::close(logits, want.at("logits"), 1e-5, 1e-6));
  test::expect_adapter_grads(model, want, 1e-6);
}

// Adapters on Linears with biases (Hugging Face Llama's attention_bias and mlp_bias): the frozen biases get no
// gradient, the adapters' gradients match PEFT's (within 1e-5: the biases make layer 1's q gradients ill-conditioned,
// as in tests/nn/llama_test.cpp), and a merge keeps the biases and the logits.
TEST(Lora, LlamaWithBiasesMatchesPyTorchFloat32) {
  models::LlamaConfig c = test::tiny_llama_config(67);
  c.attention_bias = c.mlp_bias = true;
  models::Llama model(c, 3);
  {
    Generator gen(5);
    NoGradGuard no_grad;
    for (auto& [name, p] : model.named_parameters())
      if (name.ends_with(".bias")) p.copy_(normal(p.shape(), 0.0, 0.1, DType::Float32, &gen));
  }
  nn::LoraConfig cfg{.r = 8, .alpha = 16, .target_modules = {"wq", "wo", "w2"}};
  EXPECT_EQ(nn::apply_lora(model, cfg).size(), 6u);
  test::randomize_lora_b(model, 7);
  const Tensor x = test::random_token_batch(3, 16, 67, 1), y = test::random_token_batch(3, 16, 67, 2);
  const StateDict want = run_oracle(
      "lora_llama_bias_f32",
      test::llama_config_json(c, detail::cat(", \"model\": \"llama\", \"scaling\": ", cfg.scaling())), model,
      {{"x", x}, {"y", y}});
  ASSERT_FALSE(want.empty());
  const Tensor logits = model(x);
  F::cross_entropy(logits.reshape({-1, 67}), y.reshape({-1})).backward();
  EXPECT_TRUE(test::close(logits, want.at("logits"), 1e-5, 1e-6));
  test::expect_adapter_grads(model, want, 1e-5);
  const Tensor bias = model.state_dict().at("layers.0.attention.wo.bias").clone();
  nn::merge_lora(model);
  NoGradGuard no_grad;
  EXPECT_TRUE(test::bit_equal(model.state_dict().at("layers.0.attention.wo.bias"), bias));
  EXPECT_TRUE(test::close(model(x), logits, 1e-5, 1e-5));
}

// O1 bf16 with a frozen base: the base's Linear and embedding weights are stored in bfloat16 (LayerNorms and
// adapters stay float32); PyTorch gets the same storage and autocast.
TEST(Lora, AutocastBFloat16WithA16BitBaseMatchesPyTorch) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  auto model = models::gpt(c, 4);
  nn::LoraConfig cfg{.r = 8, .alpha = 16, .target_modules = {"c_attn", "c_proj"}, .rslora = true};
  nn::apply_lora(*model, cfg);
  test::randomize_lora_b(*model, 8);
  std::vector<Tensor> trainable;
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  optim::Adam opt(trainable, {});
  auto amp = amp::initialize(*model, {&opt}, amp::OptLevel::O1, DType::BFloat16);
  for (const auto& [name, p] : model->named_parameters()) {
    const bool fp32 = name.find(".lora_") != std::string::npos || name.find(".ln_") != std::string::npos;
    EXPECT_EQ(p.dtype(), fp32 ? DType::Float32 : DType::BFloat16) << name;
  }
  const Tensor x = test::random_token_batch(3, 16, c.vocab_size, 5),
               y = test::random_token_batch(3, 16, c.vocab_size, 6);
  const StateDict want = run_oracle(
      "lora_bf16", test::gpt_config_json(c, detail::cat(", \"scaling\": ", cfg.scaling(), ", \"autocast\": \"bf16\"")),
      *model, {{"x", x}, {"y", y}});
  ASSERT_FALSE(want.empty());
  Tensor loss;
  {
    auto fw = amp->forward();
    loss = test::lm_loss(*model, x, y);
  }
  loss.backward();
  EXPECT_NEAR(loss.item(), want.at("loss").item(), 1e-2 * want.at("loss").item());
  test::expect_adapter_grads(*model, want, 5e-2);
}

// A power-of-two scaling (alpha / r = 2, 4) scales lora_B's weight instead of the product (one pass over the
// activations fewer each way): logits and every adapter gradient bit-equal to the product scaled, which an identity
// forward hook on each lora_B keeps (the path the PyTorch tests above check), in float32 and under bf16 autocast.
TEST(Lora, PowerOfTwoScalingOnBsWeightIsBitEqualToScalingTheProduct) {
  const models::GPTConfig c = test::tiny_gpt_config(67);
  const Tensor x = test::random_token_batch(3, 16, c.vocab_size, 1),
               y = test::random_token_batch(3, 16, c.vocab_size, 2);
  for (double alpha : {16.0, 32.0}) {
    for (bool autocast : {false, true}) {
      SCOPED_TRACE(detail::cat("alpha ", alpha, autocast ? ", bf16 autocast" : ", float32"));
      std::map<std::string, Tensor> results[2];
      for (int hooked : {0, 1}) {
        auto model = models::gpt(c, 3);
        nn::apply_lora(*model, nn::LoraConfig{.r = 8, .alpha = alpha, .target_modules = {"c_attn", "c_proj", "c_fc"}});
        test::randomize_lora_b(*model, 9);
        for (auto& [path, layer] : nn::lora_layers(*model))
          if (hooked) layer->lora->lora_B->register_forward_hook([](const Tensor&) { return Tensor(); });
        Tensor logits;
        {
          amp::AutocastGuard guard(DType::BFloat16, autocast);
          logits = (*model)(x);
        }
        F::cross_entropy(logits.reshape({-1, c.vocab_size}).to(DType::Float32), y.reshape({-1})).backward();
        results[hooked]["logits"] = logits.detach();
        for (const auto& [name, p] : model->named_parameters())
          if (p.requires_grad()) results[hooked][name] = p.grad();
      }
      ASSERT_EQ(results[0].size(), results[1].size());
      for (const auto& [name, t] : results[0]) EXPECT_TRUE(test::bit_equal(t, results[1].at(name))) << name;
    }
  }
}

// Castor's Dropout as the adapters use it, recording each mask it draws: the draw is nn::Dropout's own (on ones of the
// input's shape, from the same generator, so the draws and their order are those of an unrecorded run) and the output
// is input * mask, which is what F::dropout computes.
class RecordingDropout : public nn::Dropout {
 public:
  explicit RecordingDropout(double p) : nn::Dropout(p) {}
  Tensor forward(const Tensor& input) override {
    Tensor mask;
    {
      NoGradGuard no_grad;
      mask = nn::Dropout::forward(ones(input.shape(), input.dtype()));
    }
    masks.push_back(mask);
    return mul(input, mask);
  }
  std::vector<Tensor> masks;  // one per forward
};

// LoRA training as a PEFT user sets it up (adapters on every Linear but lm_head, PEFT's init: A kaiming-uniform, B zero;
// lora_dropout 0.1; AdamW with weight decay 0.01 over the trainable parameters), 20 steps in float32, against PyTorch
// (tests/oracle/lora_oracle.py train) on the same base, initial adapters and batches. Dropout: Castor's masks are
// recorded as they are drawn (RecordingDropout) and passed to the oracle, which multiplies each adapter's input by
// them, so both sides drop the same elements. Each step's loss within 1e-5 relative, and every adapter tensor after
// every step within 1e-5 (relative L2); the adapters move far more than that.
TEST(Lora, TwentyAdamWStepsWithDropoutAndWeightDecayMatchPyTorch) {
  // The dropout masks come from the default generator: seeded, so that they do not depend on the tests run before this
  // one in the same process (with some draws an adapter's relative difference reached 1.6e-5 at step 15).
  manual_seed(0);
  models::GPTConfig c = test::tiny_gpt_config(67);
  auto model = models::gpt(c, 6);
  const nn::LoraConfig cfg{
      .r = 4, .alpha = 8, .dropout = 0.1, .target_modules = {"c_attn", "c_proj", "c_fc"}, .seed = 2};
  nn::apply_lora(*model, cfg);
  model->train();
  std::map<std::string, std::shared_ptr<RecordingDropout>> recorders;
  for (auto& [path, layer] : nn::lora_layers(*model)) {
    auto r = std::make_shared<RecordingDropout>(cfg.dropout);
    layer->lora->lora_dropout = r;
    recorders[path] = r;
  }
  StateDict weights;  // the base and the initial adapters, as the oracle loads them
  for (const auto& [k, v] : model->state_dict()) weights.emplace(k, v.to(DType::Float32).clone());
  std::vector<Tensor> trainable;
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = 1e-2, o.weight_decay = 0.01;
  auto opt = optim::make_adamw(trainable, o);
  const int64_t steps = 20;
  StateDict batch;
  std::vector<double> losses;
  std::vector<StateDict> adapters;
  for (int64_t i = 0; i < steps; ++i) {
    const Tensor x = test::random_token_batch(3, 16, c.vocab_size, 100 + 2 * i),
                 y = test::random_token_batch(3, 16, c.vocab_size, 101 + 2 * i);
    batch[detail::cat("x.", i)] = x, batch[detail::cat("y.", i)] = y;
    const Tensor loss = test::lm_loss(*model, x, y);
    opt->zero_grad();
    loss.backward();
    opt->step();
    losses.push_back(loss.item());
    StateDict now;
    for (const auto& [k, v] : nn::lora_state_dict(*model)) now.emplace(k, v.clone());
    adapters.push_back(std::move(now));
  }
  for (const auto& [path, r] : recorders) {
    ASSERT_EQ(r->masks.size(), static_cast<size_t>(steps)) << path;
    for (int64_t i = 0; i < steps; ++i) batch[detail::cat("mask.", i, ".", path)] = r->masks[i];
  }
  const test::ScratchDir dir("lora_train");
  save_safetensors(dir + "/weights.safetensors", weights);
  save_safetensors(dir + "/batch.safetensors", batch);
  const std::string config = test::gpt_config_json(
      c, detail::cat(", \"scaling\": ", cfg.scaling(), ", \"lr\": ", o.lr, ", \"beta1\": ", o.beta1, ", \"beta2\": ",
                     o.beta2, ", \"eps\": ", o.eps, ", \"weight_decay\": ", o.weight_decay, ", \"steps\": ", steps));
  ASSERT_TRUE(test::run_oracle("lora_oracle.py", {"train", config, dir + "/weights.safetensors",
                                                  dir + "/batch.safetensors", dir + "/out.safetensors"}));
  const StateDict want = load_safetensors(dir + "/out.safetensors").tensors;
  const std::vector<double> torch_losses = want.at("loss").to_vector<double>();
  double worst_loss = 0, worst_adapter = 0, moved = 0;
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_NEAR(losses[i], torch_losses[i], 1e-5 * torch_losses[i]) << "step " << i;
    worst_loss = std::max(worst_loss, std::fabs(losses[i] - torch_losses[i]) / torch_losses[i]);
    for (const auto& [k, v] : adapters[i]) {
      const Tensor& theirs = want.at(detail::cat(i, ".", k));
      EXPECT_LE(test::rel_l2(v, theirs), 1e-5) << k << " after step " << i;
      worst_adapter = std::max(worst_adapter, test::rel_l2(v, theirs));
      if (i == steps - 1) moved = std::max(moved, test::rel_l2(v, weights.at(k)));
    }
  }
  std::printf("20 LoRA AdamW steps: losses %.6f -> %.6f; max relative loss difference %.2e, adapters %.2e\n",
              torch_losses[0], torch_losses[steps - 1], worst_loss, worst_adapter);
  EXPECT_GT(moved, 1e-2);  // the adapters trained: a Castor run that skipped its updates would fail above
}

// The bytes an optimizer holds (state and master weights).
int64_t optimizer_bytes(const optim::Optimizer& opt) {
  int64_t n = 0;
  for (const auto& [key, t] : opt.state_dict())
    if (key.rfind("state.", 0) == 0 || key.rfind("master.", 0) == 0) n += t.numel() * dtype_size(t.dtype());
  return n;
}

// AdamW over the trainable parameters: only the adapters get gradients and state (float32 moments, and float32
// masters at O2; at O3 the adapters are bfloat16, updated without masters), whatever the level; a step leaves the
// base as it was.
TEST(Lora, BaseGetsNoGradientAndNoOptimizerState) {
  for (amp::OptLevel level : {amp::OptLevel::O0, amp::OptLevel::O1, amp::OptLevel::O2, amp::OptLevel::O3}) {
    models::GPTConfig c = test::tiny_gpt_config(67);
    auto model = models::gpt(c, 5);
    nn::apply_lora(*model, nn::LoraConfig{.target_modules = {"c_attn"}});
    std::vector<Tensor> trainable;
    int64_t adapter_elems = 0;
    for (const Tensor& p : model->parameters())
      if (p.requires_grad()) trainable.push_back(p), adapter_elems += p.numel();
    const StateDict base_before = [&] {
      StateDict sd;
      for (const auto& [k, v] : model->state_dict()) sd.emplace(k, v.clone());
      return sd;
    }();
    auto opt = optim::make_adamw(trainable, optim::AdamOptions::adamw());
    amp::Overrides ov;
    if (level == amp::OptLevel::O3) ov.rounding = optim::Rounding::Stochastic;
    auto amp = amp::initialize(*model, {opt.get()}, level, DType::BFloat16, ov);
    Tensor loss;
    {
      auto fw = amp->forward();
      loss = test::lm_loss(*model, test::random_token_batch(2, 16, 67, 1), test::random_token_batch(2, 16, 67, 2));
    }
    amp->scale_loss(loss, *opt).backward();
    opt->step();
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.grad().defined(), p.requires_grad()) << name;
    const int64_t per_elem = level == amp::OptLevel::O2 ? 12 : 8;  // exp_avg, exp_avg_sq (+ master) in float32
    EXPECT_EQ(optimizer_bytes(*opt), per_elem * adapter_elems + 4 * static_cast<int64_t>(trainable.size()))
        << amp::opt_level_name(level);
    for (const auto& [k, v] : model->state_dict())
      if (k.find(".lora_") == std::string::npos) {  // as it was, in the dtype the level stores it in
        EXPECT_TRUE(same_bits(v, base_before.at(k).to(v.dtype()))) << k;
      }
  }
}

// O1 float16: dynamic loss scaling scales and unscales the adapters' gradients only; two accumulated micro-batches
// clipped to norm 0.5 give the float32 run's clipped sum, within float16's tolerance.
TEST(Lora, LossScalingClippingAndAccumulationAtO1Float16) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  const Tensor x[] = {test::random_token_batch(2, 16, 67, 1), test::random_token_batch(2, 16, 67, 3)};
  const Tensor y[] = {test::random_token_batch(2, 16, 67, 2), test::random_token_batch(2, 16, 67, 4)};
  std::vector<Tensor> grads[2];
  for (amp::OptLevel level : {amp::OptLevel::O0, amp::OptLevel::O1}) {
    auto model = models::gpt(c, 5);
    nn::apply_lora(*model, nn::LoraConfig{.target_modules = {"c_attn", "c_fc"}});
    test::randomize_lora_b(*model, 3);
    std::vector<Tensor> trainable;
    for (const Tensor& p : model->parameters())
      if (p.requires_grad()) trainable.push_back(p);
    optim::SGD opt(trainable, {.lr = 0.1});
    auto amp = amp::initialize(*model, {&opt}, level, DType::Float16);
    for (int k = 0; k < 2; ++k) {
      Tensor loss;
      {
        auto fw = amp->forward();
        loss = test::lm_loss(*model, x[k], y[k]);
      }
      amp->scale_loss(loss, opt).backward();
    }
    if (level == amp::OptLevel::O1) {
      EXPECT_EQ(amp->scaler().get_scale(), 65536.0);
    }
    const std::vector<Tensor> masters = amp::master_params(opt);  // unscaled here
    EXPECT_EQ(masters.size(), trainable.size());
    amp::clip_grad_norm_(masters, 0.5);
    for (const Tensor& p : masters) grads[level == amp::OptLevel::O1].push_back(p.grad().to(DType::Float32).clone());
    for (const auto& [name, p] : model->named_parameters())
      if (!p.requires_grad()) {
        EXPECT_FALSE(p.grad().defined()) << name;
      }
  }
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_LE(test::rel_l2(grads[1][i], grads[0][i]), 2e-2) << i;
}

TEST(Lora, MergedLogitsMatchAndUnmergeRestoresTheWeights) {
  models::GPTConfig c = test::tiny_gpt_config(67);
  auto model = models::gpt(c, 6);
  nn::apply_lora(*model, nn::LoraConfig{.r = 4, .alpha = 16});
  test::randomize_lora_b(*model, 9);
  model->eval();
  const Tensor x = test::random_token_batch(2, 16, 67, 3);
  const Tensor unmerged = (*model)(x).detach();
  std::vector<Tensor> before;
  for (const auto& [path, layer] : nn::lora_layers(*model)) before.push_back(layer->weight.clone());
  nn::merge_lora(*model);
  EXPECT_TRUE(test::close((*model)(x), unmerged, 1e-6, 1e-6));
  EXPECT_FALSE(same_bits(nn::lora_layers(*model)[0].second->weight, before[0]));
  nn::unmerge_lora(*model);
  size_t i = 0;
  for (const auto& [path, layer] : nn::lora_layers(*model)) EXPECT_TRUE(same_bits(layer->weight, before[i++])) << path;
  EXPECT_TRUE(same_bits((*model)(x), unmerged));
  // merge_and_unload leaves a plain GPT whose state dict has the base's keys only.
  nn::merge_and_unload(*model);
  EXPECT_TRUE(test::close((*model)(x), unmerged, 1e-6, 1e-6));
  EXPECT_TRUE(nn::lora_layers(*model).empty());
  EXPECT_EQ(model->state_dict().size(), models::gpt(c)->state_dict().size());
}

TEST(Lora, BadConfigurationsAreOneLineErrors) {
  auto model = models::gpt(test::tiny_gpt_config(67), 3);
  auto expect = [&](const nn::LoraConfig& cfg, const std::string& what) {
    test::expect_error([&] { nn::apply_lora(*model, cfg); }, {what});
  };
  expect({.r = 0}, "r must be positive, got 0");
  expect({.alpha = -1}, "alpha must be positive");
  expect({.dropout = 1}, "dropout must be in [0, 1)");
  expect({.r = 33}, "rank 33 is larger than transformer.h.0.attn.c_attn's dimensions (96, 32)");
  expect({.target_modules = {"wq", "c_attn"}},
         "target module(s) \"wq\" match no Linear layer of GPT; valid names: c_attn, c_fc, c_proj, lm_head");
  for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(p.requires_grad()) << name << " (unchanged)";
  nn::apply_lora(*model, {});
  expect({}, "GPT already has LoRA adapters");
}

}  // namespace
}  // namespace castor
