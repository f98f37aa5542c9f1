// What the GPT and Llama tests share: token batches, the loss, nanoGPT's AdamW groups, a run of a model's PyTorch twin
// (tests/oracle/gpt_oracle.py, llama_oracle.py) from the same weights, the gradient comparison, the AdamW training
// curves of both sides, and training under every opt level.
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/language_model.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "test_util.h"

namespace castor::test {

// (b, t) int64 ids drawn uniformly from [0, vocab).
inline Tensor random_token_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v(b * t);
  for (double& x : v) x = std::floor(gen.next_double() * vocab);
  return tensor(v, Shape{b, t}, DType::Int64);
}

// (b, t) int64 ids of a learnable stream: mostly "next = previous + 1", some noise.
inline Tensor learnable_token_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v(b * t);
  double prev = 0;
  for (double& x : v)
    x = prev = gen.next_double() < 0.8 ? std::fmod(prev + 1, vocab) : std::floor(gen.next_double() * vocab);
  return tensor(v, Shape{b, t}, DType::Int64);
}

// ||a - b|| / ||b||.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += y[i] * y[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

// The mean cross-entropy of the model's logits for x (B, T) against y (B, T).
inline Tensor lm_loss(models::LanguageModel& model, const Tensor& x, const Tensor& y) {
  const Tensor logits = model(x);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

// nanoGPT's configure_optimizers: AdamW with weight decay on tensors of 2 or more dims only; beta2 0.99.
inline std::unique_ptr<optim::Adam> lm_adamw(nn::Module& model, double lr, double weight_decay) {
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = lr, o.weight_decay = weight_decay, o.beta2 = 0.99;
  auto opt = optim::make_adamw(decay, o);
  opt->add_param_group(no_decay, lr, /*weight_decay=*/0.0);
  return opt;
}

// Writes the model's weights and `batch`, runs `script` (`mode` CONFIG WEIGHTS BATCH OUT) in a new directory `name`,
// reads what it wrote (empty, with a test failure, when it failed).
inline StateDict run_lm_twin(const std::string& script, const std::string& mode, const std::string& name,
                             const std::string& config, const nn::Module& model, const StateDict& batch) {
  const ScratchDir dir(name);
  save_safetensors(dir + "/weights.safetensors", model.state_dict());
  save_safetensors(dir + "/batch.safetensors", batch);
  if (!run_oracle(script,
                  {mode, config, dir + "/weights.safetensors", dir + "/batch.safetensors", dir + "/out.safetensors"}))
    return {};
  return load_safetensors(dir + "/out.safetensors").tensors;
}

// Every parameter's gradient within `tol` relative L2 of the twin's "grad.<name>".
inline void expect_grads_match(const nn::Module& model, const StateDict& want, double tol) {
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(want.count("grad." + name)) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LE(rel_l2(p.grad(), want.at("grad." + name)), tol) << name;
  }
}

// `steps` AdamW steps (lr 1e-3, weight decay 0.1, beta2 0.99, clip 1.0) over 4 cycled learnable batches of 4 rows of
// the model's block size, Castor's and the twin's (`script` train `config`: the model's keys, the recipe added here)
// from the same weights, each under bfloat16 autocast or not; returns both loss curves.
inline std::pair<std::vector<double>, std::vector<double>> lm_curves(const std::string& script,
                                                                     const std::string& config,
                                                                     models::LanguageModel& model, bool autocast,
                                                                     int steps) {
  const int64_t T = model.block_size();
  StateDict batch;
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 4; ++i) {
    const Tensor s = learnable_token_batch(4, T + 1, model.vocab_size(), 100 + i);
    batches.emplace_back(s.narrow(1, 0, T).contiguous(), s.narrow(1, 1, T).contiguous());
    batch["x." + std::to_string(i)] = batches.back().first;
    batch["y." + std::to_string(i)] = batches.back().second;
  }
  const std::string cfg = detail::cat(config.substr(0, config.rfind('}')),
                                      ", \"lr\": 1e-3, \"weight_decay\": 0.1, "
                                      "\"beta1\": 0.9, \"beta2\": 0.99, \"steps\": ",
                                      steps, autocast ? ", \"autocast\": \"bf16\"" : "", "}");
  const std::string name = script.substr(0, script.find('_')) + (autocast ? "_curve_bf16" : "_curve_f32");
  const StateDict out = run_lm_twin(script, "train", name, cfg, model, batch);
  const std::vector<double> want = out.count("loss") ? out.at("loss").to_vector<double>() : std::vector<double>{};
  auto opt = lm_adamw(model, 1e-3, 0.1);
  std::vector<double> got;
  for (int step = 0; step < steps; ++step) {
    const auto& [x, y] = batches[step % batches.size()];
    Tensor loss;
    {
      amp::AutocastGuard guard(DType::BFloat16, /*enabled=*/autocast);
      loss = test::lm_loss(model, x, y);
    }
    opt->zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model.parameters(), /*max_norm=*/1.0);
    opt->step();
    got.push_back(loss.item());
  }
  return {got, want};
}

// Every opt level in bfloat16 and float16 trains a model `make()` builds (vocabulary 29, block 16): 60 AdamW steps
// (lr 3e-3) on learnable batches, the loss below 0.75x the first; `check_o2` sees the model and optimizer after
// amp::initialize at O2.
inline void expect_every_opt_level_trains(
    const std::function<std::shared_ptr<models::LanguageModel>()>& make,
    const std::function<void(models::LanguageModel&, optim::Adam&, DType)>& check_o2) {
  using amp::OptLevel;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (OptLevel level : {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + amp::opt_level_name(level));
      auto model = make();
      auto opt = lm_adamw(*model, 3e-3, 0.1);
      auto a = amp::initialize(*model, {opt.get()}, level, dtype);
      if (level == OptLevel::O2) check_o2(*model, *opt, dtype);
      double first = 0, last = 0;
      for (int step = 0; step < 60; ++step) {
        const Tensor s = learnable_token_batch(4, 17, model->vocab_size(), step % 4);
        const Tensor x = s.narrow(1, 0, 16).contiguous(), y = s.narrow(1, 1, 16).contiguous();
        Tensor loss;
        {
          auto fw = a->forward();
          loss = test::lm_loss(*model, x, y);
        }
        EXPECT_EQ(loss.dtype(), DType::Float32);
        a->scale_loss(loss, *opt).backward();
        opt->step();
        opt->zero_grad();
        (step == 0 ? first : last) = loss.item();
      }
      EXPECT_LT(last, 0.75 * first);
    }
  }
}

}  // namespace castor::test
