// Apex loops written literally: opt.step() after scale_loss, master_params and clipping, patched forward casts,
// several models/optimizers/losses, amp.state_dict keys, disable_casts, float32 gradient accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

using amp::OptLevel;

const double kInf = std::numeric_limits<double>::infinity();

const std::vector<OptLevel> kLevels = {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3};
enum class Opt { SGD, Adam, AdamW, SGDMomentum, AdamW8bit };
const char* opt_name(Opt o) {
  const char* names[] = {"SGD", "Adam", "AdamW", "SGD with momentum", "AdamW8bit"};
  return names[static_cast<int>(o)];
}

// conv (3 -> 4) -> BatchNorm -> relu -> flatten -> linear (64 -> 3) on (N, 3, 4, 4) input.
std::shared_ptr<nn::Sequential> conv_bn_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1),
      std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(64, 3)});
}

std::unique_ptr<optim::Optimizer> make_opt(Opt o, const std::vector<Tensor>& params) {
  if (o == Opt::SGD) return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.01});
  if (o == Opt::Adam) return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 1e-3});
  if (o == Opt::SGDMomentum)
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  if (o == Opt::AdamW8bit)  // 8-bit moments for the conv and linear weights: blocks of 64, no size floor
    return std::make_unique<optim::AdamW8bit>(params, optim::AdamW8bitOptions{.block_size = 64, .min_8bit_size = 0});
  return optim::make_adamw(params, optim::AdamOptions::adamw());
}

Tensor images(int i) {
  Generator gen(1000 + i);
  return randn({4, 3, 4, 4}, DType::Float32, &gen);
}

Tensor labels(int i) {
  Generator gen(2000 + i);
  return randint(0, 3, {4}, &gen);
}

// One model + optimizer at a level (float16: the dynamic scale starts at 2^16 at O1/O2).
struct Training {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  Training(OptLevel level, Opt o, const amp::Overrides& ov = {}) : model(conv_bn_net(/*seed=*/1)) {
    opt = make_opt(o, model->parameters());
    amp = amp::initialize(*model, {opt.get()}, level, DType::Float16, ov);
  }
  // Apex: loss = loss_fn(model(input), target)
  Tensor loss(int i, double times = 1.0) {
    auto fw = amp->forward();
    return mul(F::cross_entropy((*model)(images(i)), labels(i)), times);
  }
};

// Parameters (and master weights) of the run, for bit comparison.
std::vector<Tensor> weights(Training& r) {
  std::vector<Tensor> out;
  for (const auto& g : r.opt->param_groups())
    for (const auto& s : g.slots) out.push_back((s.master.defined() ? s.master : s.param).detach().clone());
  return out;
}

TEST(ApexLoop, OptimizerStepAfterScaleLossUnscalesSkipsAndUpdatesAtEveryLevel) {
  for (OptLevel level : kLevels)
    for (Opt o : {Opt::SGD, Opt::Adam, Opt::AdamW}) {
      SCOPED_TRACE(std::string(amp::opt_level_name(level)) + " " + opt_name(o));
      Training literal(level, o), helper(level, o);
      const bool dynamic = level == OptLevel::O1 || level == OptLevel::O2;
      for (int it = 0; it < 4; ++it) {
        const double times = it == 2 && dynamic ? 1e38 : 1.0;  // iteration 2 overflows (the scaled loss is inf)
        // with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()
        // optimizer.step(); optimizer.zero_grad()
        const std::vector<Tensor> before = weights(literal);
        const double scale = literal.amp->scaler().get_scale();
        const Tensor g0 = literal.model->parameters().back().grad();  // none yet: zero_grad dropped it
        EXPECT_FALSE(g0.defined());
        literal.amp->scale_loss(literal.loss(it, times), *literal.opt).backward();
        // The gradients are scaled now; the hand-worked SGD step on the float32 bias: w - lr * g / scale.
        const Tensor bias = literal.model->parameters().back();
        const std::vector<float> g = bias.grad().to(DType::Float32).to_vector<float>();
        literal.opt->step();
        literal.opt->zero_grad();
        // The same loop through the explicit helper.
        helper.amp->scale_loss(helper.loss(it, times), *helper.opt).backward();
        const bool stepped = helper.amp->step(*helper.opt);
        helper.opt->zero_grad();
        const std::vector<Tensor> after = weights(literal), twin = weights(helper);
        for (size_t k = 0; k < after.size(); ++k) EXPECT_TRUE(test::bit_equal(after[k], twin[k])) << k;
        EXPECT_EQ(literal.amp->scaler().get_scale(), helper.amp->scaler().get_scale());
        if (it == 2 && dynamic) {
          EXPECT_FALSE(stepped);
          for (size_t k = 0; k < after.size(); ++k) EXPECT_TRUE(test::bit_equal(after[k], before[k])) << k;
          EXPECT_EQ(literal.amp->scaler().get_scale(), scale / 2);  // halved on overflow
          continue;
        }
        if (!stepped) continue;  // float16 O3 overflowing for real; compared above
        // Never the scaled gradients: the weights move by about lr (Adam) or lr * |g| / scale (SGD), not scale x.
        double moved = 0;
        for (size_t k = 0; k < after.size(); ++k)
          for (size_t e = 0; e < static_cast<size_t>(after[k].numel()); ++e)
            moved = std::max(moved, std::fabs(after[k].to(DType::Float64).to_vector<double>()[e] -
                                              before[k].to(DType::Float64).to_vector<double>()[e]));
        EXPECT_LT(moved, 0.05);
        if (o == Opt::SGD && level != OptLevel::O3) {  // the float32 bias, by hand (PyTorch's fma step)
          const float inv = amp::inverse_scale(static_cast<float>(scale));
          const std::vector<float> w0 = before.back().to_vector<float>(), w1 = after.back().to_vector<float>();
          for (size_t e = 0; e < w0.size(); ++e)
            EXPECT_EQ(w1[e], std::fma(scale == 1 ? g[e] : g[e] * inv, -0.01f, w0[e])) << e;
        }
      }
      EXPECT_EQ(literal.amp->scaler().steps_skipped(), helper.amp->scaler().steps_skipped());
      if (dynamic) {
        EXPECT_GE(literal.amp->scaler().steps_skipped(), 1);
      }
    }
}

TEST(ApexLoop, StepWithoutScaleLossIsAPlainStep) {
  Training r(OptLevel::O1, Opt::SGD);
  r.loss(0).backward();  // unscaled backward: Apex steps it as it is
  const float g = r.model->parameters().back().grad().to_vector<float>()[0];
  const float w = r.model->parameters().back().detach().to_vector<float>()[0];
  r.opt->step();
  EXPECT_EQ(r.model->parameters().back().detach().to_vector<float>()[0], std::fma(g, -0.01f, w));
  EXPECT_EQ(r.amp->scaler().steps_taken(), 0);
}

TEST(ApexLoop, OptimizerAndAmpMayGoInEitherOrder) {
  auto model = conv_bn_net(/*seed=*/1);
  auto opt = make_opt(Opt::SGD, model->parameters());
  auto a = amp::initialize(*model, {opt.get()}, OptLevel::O1, DType::Float16);
  a.reset();  // the optimizer steps plainly again
  EXPECT_EQ(opt->step_interceptor(), nullptr);
  a = amp::initialize(*model, {opt.get()}, OptLevel::O1, DType::Float16);
  opt.reset();  // the Amp outlives its optimizer (it must not be used then, but may be destroyed)
  a.reset();
}

// The float32 gradients the step will use, worked out by hand from the scaled ones: each widened to float32
// and multiplied by 1/scale in float32 (Apex/PyTorch's unscale). Returns their float64 2-norm.
double unscaled_norm(const std::vector<Tensor>& params, double scale) {
  const float inv = amp::inverse_scale(static_cast<float>(scale));
  double sum = 0;
  for (const Tensor& p : params)
    for (float v : p.grad().to(DType::Float32).to_vector<float>()) sum += static_cast<double>(v * inv) * (v * inv);
  return std::sqrt(sum);
}

TEST(ApexLoop, ClipGradNormMeasuresAndClipsTheStepsFloat32Gradients) {
  enum class Form { UnscaleThenModelParams, ModelParams, MasterParams };
  for (OptLevel level : {OptLevel::O1, OptLevel::O2, OptLevel::O3})
    for (Form form : {Form::UnscaleThenModelParams, Form::ModelParams, Form::MasterParams}) {
      SCOPED_TRACE(std::string(amp::opt_level_name(level)) + " form " + std::to_string(static_cast<int>(form)));
      Training r(level, Opt::SGD, {.loss_scale = 1024.0});  // a static scale, so no step overflows
      r.amp->scale_loss(r.loss(0), *r.opt).backward();
      const std::vector<Tensor> params = r.model->parameters();
      const double want = unscaled_norm(params, 1024);
      const double max_norm = want / 4;
      double norm = 0;
      switch (form) {
        case Form::UnscaleThenModelParams:  // PyTorch's habit: unscale_, then clip the model's parameters
          r.amp->unscale_(*r.opt);
          norm = amp::clip_grad_norm_(params, max_norm);
          break;
        case Form::ModelParams: norm = amp::clip_grad_norm_(params, max_norm); break;
        case Form::MasterParams: norm = amp::clip_grad_norm_(amp::master_params(*r.opt), max_norm); break;
      }
      EXPECT_NEAR(norm, want, want * 1e-12);
      // What the step will use now has the clipped norm, BatchNorm's float32 gradients included.
      double sum = 0;
      for (const Tensor& g : optim::step_grads(params))
        for (double v : g.to_vector<double>()) sum += v * v;
      EXPECT_NEAR(std::sqrt(sum), max_norm, max_norm * 1e-5);
      const std::vector<Tensor> before = weights(r);
      r.opt->step();  // must not unscale again
      const std::vector<Tensor> after = weights(r);
      double moved = 0;
      for (size_t k = 0; k < after.size(); ++k) {
        const std::vector<double> a = after[k].to(DType::Float64).to_vector<double>();
        const std::vector<double> b = before[k].to(DType::Float64).to_vector<double>();
        for (size_t e = 0; e < a.size(); ++e) moved += (a[e] - b[e]) * (a[e] - b[e]);
      }
      // SGD moves the weights by lr * clipped gradient (16-bit weights at O3 round the move).
      EXPECT_NEAR(std::sqrt(moved), 0.01 * max_norm, 0.01 * max_norm * (level == OptLevel::O3 ? 0.2 : 1e-4));
    }
}

// The trainer's fused form (Amp::unscale_clip_ then step: one read pass for the norm and the inf check, the unscale
// and clip multiplied in the update's registers) against the PyTorch-style calls (unscale_, clip_grad_norm_, step):
// weights, optimizer state, the scale and its bookkeeping bit-equal over several steps with dynamic loss scaling,
// one of them skipped for an inf gradient, with clipping on and off; O1 (float32 gradients, unscaled in place) and
// O2 (float16 gradients unscaled into float32 buffers, float32 masters); O0 (no scaler: the clip folded alone).
TEST(ApexLoop, FusedUnscaleClipStepIsBitEqualToUnscaleClipGradNormStep) {
  for (OptLevel level : {OptLevel::O0, OptLevel::O1, OptLevel::O2})
    for (Opt o : {Opt::AdamW, Opt::AdamW8bit, Opt::SGDMomentum})
      for (double max_norm : {0.0, 0.05}) {
        SCOPED_TRACE(std::string(amp::opt_level_name(level)) + " " + opt_name(o) + " max_norm " +
                     std::to_string(max_norm));
        Training fused(level, o), plain(level, o);
        int clipped = 0;
        const int skipped = level == OptLevel::O0 ? -1 : 2;  // step 2 overflows: skipped, the scale backs off
        for (int i = 0; i < 5; ++i) {
          const double times = i == skipped ? kInf : 1.0;
          fused.amp->scale_loss(fused.loss(i, times), *fused.opt).backward();
          plain.amp->scale_loss(plain.loss(i, times), *plain.opt).backward();
          const double norm = fused.amp->unscale_clip_(*fused.opt, max_norm);
          plain.amp->unscale_(*plain.opt);
          if (max_norm > 0) {
            const double want = amp::clip_grad_norm_(*plain.opt, max_norm);
            if (std::isfinite(want)) {
              EXPECT_EQ(norm, want) << "step " << i;
            }
            clipped += want > max_norm;
          }
          EXPECT_EQ(fused.amp->step(*fused.opt), i != skipped);
          EXPECT_EQ(plain.amp->step(*plain.opt), i != skipped);
          fused.opt->zero_grad();
          plain.opt->zero_grad();
          const std::vector<Tensor> a = weights(fused), b = weights(plain);
          for (size_t k = 0; k < a.size(); ++k)
            EXPECT_TRUE(test::bit_equal(a[k], b[k])) << "step " << i << " param " << k;
          EXPECT_EQ(fused.amp->scaler().get_scale(), plain.amp->scaler().get_scale());
          EXPECT_EQ(fused.amp->scaler().growth_tracker(), plain.amp->scaler().growth_tracker());
          EXPECT_EQ(fused.amp->scaler().steps_skipped(), plain.amp->scaler().steps_skipped());
        }
        if (max_norm > 0) {
          EXPECT_GE(clipped, 3);  // the clip was exercised
        }
        EXPECT_EQ(fused.amp->scaler().steps_skipped(), level == OptLevel::O0 ? 0 : 1);
        const StateDict sa = fused.opt->state_dict(), sb = plain.opt->state_dict();
        ASSERT_EQ(sa.size(), sb.size());
        for (const auto& [key, t] : sa) {
          ASSERT_TRUE(sb.count(key)) << key;
          EXPECT_TRUE(test::bit_equal(t, sb.at(key))) << key;
        }
      }
}

TEST(ApexLoop, FusedUnscaleClipLeavesTheScaledGradientsAndRefusesALaterClip) {
  Training r(OptLevel::O1, Opt::AdamW);
  r.amp->scale_loss(r.loss(0), *r.opt).backward();
  const std::vector<Tensor> params = r.model->parameters();
  const Tensor before = params[0].grad().clone();
  r.amp->unscale_clip_(*r.opt, 1.0);
  EXPECT_TRUE(test::bit_equal(params[0].grad(), before));  // not rewritten: still the scaled gradient
  EXPECT_THROW(amp::clip_grad_norm_(params, 1.0), Error);
  EXPECT_TRUE(r.amp->step(*r.opt));
}

TEST(ApexLoop, MasterParamsAreTheFloat32MastersWithTheirGradients) {
  Training r(OptLevel::O2, Opt::Adam);
  r.amp->scale_loss(r.loss(0), *r.opt).backward();
  const double scale = r.amp->scaler().get_scale();
  const std::vector<Tensor> params = r.model->parameters();
  std::vector<std::vector<float>> want;
  const float inv = amp::inverse_scale(static_cast<float>(scale));
  for (const Tensor& p : params) {
    std::vector<float> g = p.grad().to(DType::Float32).to_vector<float>();
    for (float& v : g) v *= inv;
    want.push_back(g);
  }
  const std::vector<Tensor> masters = amp::master_params(*r.opt);
  ASSERT_EQ(masters.size(), params.size());
  for (size_t k = 0; k < masters.size(); ++k) {
    EXPECT_EQ(masters[k].dtype(), DType::Float32);
    ASSERT_TRUE(masters[k].grad().defined());
    EXPECT_EQ(masters[k].grad().to_vector<float>(), want[k]) << k;
  }
  // Calling it again does not unscale twice.
  EXPECT_EQ(amp::master_params(*r.opt)[0].grad().to_vector<float>(), want[0]);
}

// A probe that records the dtype its forward sees and returns its input.
struct Probe : nn::Module {
  DType seen = DType::Float32;
  Tensor forward(const Tensor& x) override {
    seen = x.dtype();
    return x;
  }
  std::string type_name() const override { return "Probe"; }
};

TEST(ApexLoop, PatchedForwardCastsFloatingInputsAndOutputs) {
  struct Case {
    OptLevel level;
    amp::Overrides ov;
    DType in, out;
  };
  const std::vector<Case> cases = {
      {OptLevel::O0, {}, DType::Float32, DType::Float32},
      {OptLevel::O1, {}, DType::Float32, DType::Float32},  // O1 casts per op, not at the model's boundary
      {OptLevel::O2, {}, DType::BFloat16, DType::Float32},
      {OptLevel::O3, {}, DType::BFloat16, DType::Float32},  // Apex: outputs float32 unless cast_model_outputs
      {OptLevel::O2, {.cast_model_outputs = DType::BFloat16}, DType::BFloat16, DType::BFloat16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(amp::opt_level_name(c.level));
    Probe probe;
    auto a = amp::initialize(probe, {}, c.level, DType::BFloat16, c.ov);
    EXPECT_EQ(probe(full({2}, 1.5)).dtype(), c.out);
    EXPECT_EQ(probe.seen, c.in);
    EXPECT_EQ(probe(full({2}, 1.5, DType::Float64)).dtype(), c.in == DType::Float32 ? DType::Float64 : c.out);
    EXPECT_EQ(probe.seen, c.in == DType::Float32 ? DType::Float64 : c.in);
    const Tensor ids = tensor({1, 2}, DType::Int64);
    EXPECT_EQ(probe(ids).dtype(), DType::Int64);  // integer inputs untouched
    EXPECT_EQ(probe.seen, DType::Int64);
  }
  // A float32 input into an O2 convolutional network: no dtype error, float32 logits, gradients to the input.
  auto model = conv_bn_net(/*seed=*/1);
  auto a = amp::initialize(*model, {}, OptLevel::O2, DType::BFloat16);
  const Tensor x = images(0).requires_grad_();
  const Tensor logits = (*model)(x);
  EXPECT_EQ(logits.dtype(), DType::Float32);
  sum(logits).backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_THROW(amp::properties_for(OptLevel::O1, DType::Float16, {.cast_model_outputs = DType::Float32}), Error);
}

TEST(ApexLoop, TwoModelsTwoOptimizersOneLoss) {
  // model1, model2, optimizer1, optimizer2 = amp.initialize([m1, m2], [o1, o2]); scale_loss(loss, [o1, o2])
  auto build = [](std::shared_ptr<nn::Sequential>& m1, std::shared_ptr<nn::Linear>& m2,
                  std::unique_ptr<optim::Optimizer>& o1, std::unique_ptr<optim::Optimizer>& o2) {
    m1 = conv_bn_net(/*seed=*/1);
    manual_seed(5);
    m2 = std::make_shared<nn::Linear>(3, 3);
    o1 = make_opt(Opt::SGD, m1->parameters());
    o2 = make_opt(Opt::Adam, m2->parameters());
    return amp::initialize({m1.get(), m2.get()}, {o1.get(), o2.get()}, OptLevel::O2, DType::Float16);
  };
  std::shared_ptr<nn::Sequential> m1, n1;
  std::shared_ptr<nn::Linear> m2, n2;
  std::unique_ptr<optim::Optimizer> o1, o2, p1, p2;
  auto a = build(m1, m2, o1, o2), b = build(n1, n2, p1, p2);
  EXPECT_EQ(m2->weight.dtype(), DType::Float16);  // every model is cast
  for (int it = 0; it < 3; ++it) {
    Tensor loss;
    {
      auto fw = a->forward();
      loss = F::cross_entropy((*m2)((*m1)(images(it))), labels(it));
    }
    a->scale_loss(loss, {o1.get(), o2.get()}).backward();
    o1->step();
    EXPECT_EQ(a->scaler().growth_tracker(), it);  // the scale updates once both optimizers stepped
    o2->step();
    EXPECT_EQ(a->scaler().growth_tracker(), it + 1);
    o1->zero_grad();
    o2->zero_grad();
    // Twin through the helper, one optimizer at a time.
    b->scale_loss(F::cross_entropy((*n2)((*n1)(images(it))), labels(it)), {p1.get(), p2.get()}).backward();
    b->step(*p1);
    b->step(*p2);
    p1->zero_grad();
    p2->zero_grad();
  }
  const auto sa = m1->state_dict(), sb = n1->state_dict();
  for (const auto& [k, v] : sa) EXPECT_TRUE(test::bit_equal(v, sb.at(k))) << k;
  EXPECT_TRUE(test::bit_equal(m2->weight, n2->weight));
  // The names of the second model's parameters are prefixed in the signature and in overflow reports.
  EXPECT_NE(a->precision_state().metadata.at("parameters").find("1.weight:float16"), std::string::npos);
}

TEST(ApexLoop, OptimizersOfOneLossSkipTogether) {
  // Apex: one overflow flag per loss, so an inf in the second model's gradients skips the first's step too.
  for (bool inf_in_first : {false, true}) {
    SCOPED_TRACE(inf_in_first ? "inf in model 1" : "inf in model 2");
    auto m1 = conv_bn_net(/*seed=*/1);
    manual_seed(5);
    auto m2 = std::make_shared<nn::Linear>(3, 3);
    auto o1 = make_opt(Opt::SGD, m1->parameters()), o2 = make_opt(Opt::SGD, m2->parameters());
    auto a = amp::initialize({m1.get(), m2.get()}, {o1.get(), o2.get()}, OptLevel::O1, DType::Float16);
    Tensor loss;
    {
      auto fw = a->forward();
      loss = F::cross_entropy((*m2)((*m1)(images(0))), labels(0));
    }
    a->scale_loss(loss, {o1.get(), o2.get()}).backward();
    Tensor(inf_in_first ? m1->parameters().back().grad() : m2->weight.grad()).fill_(kInf);
    const StateDict s1 = m1->state_dict();
    const Tensor w2 = m2->weight.detach().clone();
    o1->step();
    o2->step();
    for (const auto& [k, v] : m1->state_dict()) EXPECT_TRUE(test::bit_equal(v, s1.at(k))) << k;
    EXPECT_TRUE(test::bit_equal(m2->weight, w2));
    EXPECT_EQ(a->scaler().steps_skipped(), 2);
    EXPECT_EQ(a->scaler().get_scale(), 32768.0);
  }
}

TEST(ApexLoop, StateDictHasApexKeysAndRoundTrips) {
  Training r(OptLevel::O1, Opt::SGD);
  // (the model outlives its Amp, as initialize requires: a freed model's address could be a later model's)
  const auto second_net = conv_bn_net(1);
  auto second = amp::initialize(*second_net, {}, OptLevel::O1, DType::Float16, {}, /*num_losses=*/2);
  // Apex's LossScaler: 3 clean steps -> unskipped 3; an overflow -> scale / 2 and unskipped 0.
  for (int it = 0; it < 4; ++it) {
    r.amp->scale_loss(r.loss(it, it == 3 ? 1e38 : 1.0), *r.opt).backward();
    r.opt->step();
    r.opt->zero_grad();
    if (it == 2) {
      ASSERT_EQ(r.amp->scaler().steps_skipped(), 0);
      EXPECT_EQ(r.amp->state_dict().at("loss_scaler0.unskipped").item(), 3);
      EXPECT_EQ(r.amp->state_dict().at("loss_scaler0.loss_scale").item(), 65536);
    }
  }
  const StateDict sd = r.amp->state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd.at("loss_scaler0.loss_scale").item(), r.amp->scaler().get_scale());
  EXPECT_EQ(sd.at("loss_scaler0.unskipped").item(), 0);
  EXPECT_EQ(sd.at("loss_scaler0.loss_scale").dtype(), DType::Float32);
  EXPECT_EQ(sd.at("loss_scaler0.unskipped").dtype(), DType::Int64);
  EXPECT_EQ(second->state_dict().size(), 4u);
  EXPECT_TRUE(second->state_dict().count("loss_scaler1.unskipped"));

  Training fresh(OptLevel::O1, Opt::SGD);
  fresh.amp->load_state_dict(sd);
  EXPECT_EQ(fresh.amp->scaler().get_scale(), r.amp->scaler().get_scale());
  EXPECT_EQ(fresh.amp->scaler().growth_tracker(), 0);
  StateDict edited = sd;
  edited["loss_scaler0.unskipped"] = scalar_tensor(7, DType::Int64);
  edited["loss_scaler0.loss_scale"] = scalar_tensor(512, DType::Float32);
  fresh.amp->load_state_dict(edited);
  EXPECT_EQ(fresh.amp->scaler().get_scale(), 512);
  EXPECT_EQ(fresh.amp->scaler().growth_tracker(), 7);
  // Bad dicts name the key and change nothing.
  auto error_of = [&](const StateDict& bad) { return test::error_of([&] { fresh.amp->load_state_dict(bad); }); };
  StateDict missing = sd;
  missing.erase("loss_scaler0.unskipped");
  EXPECT_NE(error_of(missing).find("missing key \"loss_scaler0.unskipped\""), std::string::npos);
  StateDict extra = sd;
  extra["loss_scaler1.loss_scale"] = scalar_tensor(1, DType::Float32);
  EXPECT_NE(error_of(extra).find("unexpected key \"loss_scaler1.loss_scale\""), std::string::npos);
  StateDict negative = sd;
  negative["loss_scaler0.loss_scale"] = scalar_tensor(-1, DType::Float32);
  EXPECT_NE(error_of(negative).find("must be finite and > 0"), std::string::npos);
  EXPECT_EQ(fresh.amp->scaler().get_scale(), 512);
}

TEST(ApexLoop, DisableCastsIsAScope) {
  Generator gen(3);
  const Tensor x = randn({2, 4}, DType::Float32, &gen), w = randn({3, 4}, DType::Float32, &gen);
  Training r(OptLevel::O1, Opt::SGD);
  auto fw = r.amp->forward();
  EXPECT_EQ(F::linear(x, w, {}).dtype(), DType::Float16);
  {
    auto off = amp::disable_casts();  // with amp.disable_casts():
    EXPECT_FALSE(amp::is_autocast_enabled());
    EXPECT_EQ(F::linear(x, w, {}).dtype(), DType::Float32);
  }
  EXPECT_EQ(F::linear(x, w, {}).dtype(), DType::Float16);
}

TEST(ApexLoop, Float32GradientAccumulationFor16BitModels) {
  // Two micro-batches into a bfloat16 O2 model: with the option each .grad is the float32 sum of the two
  // micro-batch gradients; without it the sum is rounded to bfloat16.
  auto micro_grads = [](int i) {  // each micro-batch's gradients on its own
    auto m = conv_bn_net(/*seed=*/1);
    auto a = amp::initialize(*m, {}, OptLevel::O2, DType::BFloat16);
    F::cross_entropy((*m)(images(i)), labels(i)).backward();
    std::vector<std::vector<float>> g;
    for (const Tensor& p : m->parameters()) g.push_back(p.grad().to(DType::Float32).to_vector<float>());
    return g;
  };
  const auto g0 = micro_grads(0), g1 = micro_grads(1);
  for (bool fp32 : {true, false}) {
    SCOPED_TRACE(fp32 ? "float32 accumulation" : "16-bit accumulation");
    auto m = conv_bn_net(/*seed=*/1);
    auto opt = make_opt(Opt::SGD, m->parameters());
    auto a = amp::initialize(*m, {opt.get()}, OptLevel::O2, DType::BFloat16, {.fp32_grad_accumulation = fp32});
    for (int i = 0; i < 2; ++i) a->scale_loss(F::cross_entropy((*m)(images(i)), labels(i)), *opt).backward();
    const std::vector<Tensor> params = m->parameters();
    bool any_rounded = false;
    for (size_t k = 0; k < params.size(); ++k) {
      const Tensor g = params[k].grad();
      EXPECT_EQ(g.dtype(), fp32 ? DType::Float32 : params[k].dtype()) << k;
      const std::vector<float> got = g.to(DType::Float32).to_vector<float>();
      for (size_t e = 0; e < got.size(); ++e) {
        const float sum = g0[k][e] + g1[k][e];
        if (fp32) {
          EXPECT_EQ(got[e], sum) << k << " " << e;
        }
        any_rounded |= got[e] != sum;
      }
    }
    EXPECT_EQ(any_rounded, !fp32);
    opt->step();  // the step takes the float32 sums
    opt->zero_grad();
    a->scale_loss(F::cross_entropy((*m)(images(0)), labels(0)), *opt).backward();
    EXPECT_EQ(params[0].grad().dtype(), fp32 ? DType::Float32 : DType::BFloat16);  // also after set_to_none
  }
}

}  // namespace
}  // namespace castor
