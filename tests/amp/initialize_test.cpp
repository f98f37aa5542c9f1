// amp::initialize and Amp: each opt level's dtypes, overrides, evaluation-only use, exact resume from a checkpoint,
// forced overflows, precision-state validation, autocast on castor::F, and the cases for loss scaling and
// stochastic rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <set>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "test_util.h"

namespace castor {
namespace {

using amp::OptLevel;

const std::vector<OptLevel> kLevels = {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3};

// conv (3 -> 4) -> BatchNorm -> relu -> flatten -> linear (64 -> 3) on (N, 3, 4, 4) input; "1." is the BatchNorm.
std::shared_ptr<nn::Sequential> conv_bn_net(uint64_t seed, int64_t classes = 3) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1),
      std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(64, classes)});
}

Tensor images(int i, int64_t n, int64_t hw) {
  Generator gen(1000 + i);
  return randn({n, 3, hw, hw}, DType::Float32, &gen);
}

Tensor labels(int i, int64_t n, int64_t classes) {
  Generator gen(2000 + i);
  return randint(0, classes, {n}, &gen);
}

// The cross-entropy of the model on (x, y), run under the level's autocast.
Tensor forward_loss(const amp::Amp& a, nn::Module& model, const Tensor& x, const Tensor& y) {
  auto fw = a.forward();
  return F::cross_entropy(model(x), y);  // O2/O3: the model casts x in and its output out (Apex)
}

// One iteration: forward, scaled backward, step (skipped on overflow), zero_grad. Returns whether it stepped.
bool train_step(amp::Amp& a, nn::Module& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  a.scale_loss(forward_loss(a, model, x, y), opt).backward();
  const bool stepped = a.step(opt);
  opt.zero_grad();
  return stepped;
}

using test::error_of;

TEST(AmpInitialize, EachOptLevelSetsParamBatchNormMasterAndGradDtypes) {
  for (DType lo : {DType::Float16, DType::BFloat16}) {
    for (OptLevel level : kLevels) {
      SCOPED_TRACE(std::string(amp::opt_level_name(level)) + " " + dtype_name(lo));
      const bool cast = level == OptLevel::O2 || level == OptLevel::O3;
      const DType weight_dtype = cast ? lo : DType::Float32;
      const DType bn_dtype = level == OptLevel::O3 ? lo : DType::Float32;
      auto model = conv_bn_net(/*seed=*/1);
      optim::Adam opt(model->parameters(), {.lr = 1e-3});
      auto a = amp::initialize(*model, {&opt}, level, lo);
      EXPECT_EQ(a->properties().cast_model_type.has_value(), cast);
      EXPECT_EQ(a->properties().autocast, level == OptLevel::O1);
      // Apex: dynamic scaling for O1/O2 (float16 only: bfloat16 needs none), a static scale 1 for O3, none for O0.
      const bool dynamic = lo == DType::Float16 && (level == OptLevel::O1 || level == OptLevel::O2);
      EXPECT_EQ(a->scaler().get_scale(), dynamic ? 65536.0 : 1.0);
      EXPECT_EQ(a->scaler().is_enabled(), dynamic || level == OptLevel::O3);
      int stepped = 0;
      for (int it = 0; it < 4; ++it) {
        Tensor logits;
        Tensor loss;
        {
          auto fw = a->forward();
          logits = (*model)(images(it, 4, 4));  // float32 in at every level
          loss = F::cross_entropy(logits, labels(it, 4, 3));
        }
        // O1: linear under autocast; O2/O3: Apex's patched forward widens the output to float32.
        EXPECT_EQ(logits.dtype(), level == OptLevel::O1 ? lo : DType::Float32);
        EXPECT_EQ(loss.dtype(), DType::Float32);
        a->scale_loss(loss, opt).backward();
        for (const auto& [name, p] : model->named_parameters()) {
          const DType want = name.rfind("1.", 0) == 0 ? bn_dtype : weight_dtype;
          EXPECT_EQ(p.dtype(), want) << name;
          EXPECT_EQ(p.grad().dtype(), want) << name;
        }
        stepped += a->step(opt);  // float16 at 2^16 may overflow at first (Apex's "skipping step")
        opt.zero_grad();
      }
      EXPECT_EQ(stepped, dynamic ? a->scaler().steps_taken() : 4);
      EXPECT_GT(stepped, 0);
      for (const auto& [name, b] : model->named_buffers())
        if (name != "1.num_batches_tracked") {
          EXPECT_EQ(b.dtype(), bn_dtype) << name;
        }
      for (const optim::ParamSlot& slot : opt.param_groups()[0].slots) {
        const bool master = level == OptLevel::O2 && is_16bit_float(slot.param.dtype());
        ASSERT_EQ(slot.master.defined(), master) << slot.param.describe();
        if (!master) continue;
        EXPECT_EQ(slot.master.dtype(), DType::Float32);
        EXPECT_TRUE(test::bit_equal(slot.param, slot.master.to(lo)));             // the model holds the masters rounded
        EXPECT_FALSE(test::bit_equal(slot.master.to(lo).float_(), slot.master));  // masters hold more bits
      }
    }
  }
}

TEST(AmpInitialize, OverridesReplaceTheLevelsDefaults) {
  {
    auto model = conv_bn_net(/*seed=*/1);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    amp::initialize(*model, {&opt}, OptLevel::O2, DType::Float16,
                    {.keep_batchnorm_fp32 = false, .master_weights = false, .rounding = optim::Rounding::Stochastic});
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), DType::Float16) << name;
    for (const optim::ParamSlot& slot : opt.param_groups()[0].slots) EXPECT_FALSE(slot.master.defined());
    EXPECT_EQ(opt.rounding(), optim::Rounding::Stochastic);
  }
  {
    auto model = conv_bn_net(/*seed=*/1);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    auto a = amp::initialize(*model, {&opt}, OptLevel::O2, DType::BFloat16, {.cast_model_type = DType::Float32});
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), DType::Float32) << name;
    EXPECT_EQ(a->properties().cast_model_type, DType::Float32);
  }
  {
    // A static scale stays put; a dynamic one starts at min(2^16, max_loss_scale) and stops at min_loss_scale.
    auto model = conv_bn_net(/*seed=*/1);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    auto a = amp::initialize(*model, {&opt}, OptLevel::O1, DType::Float16, {.loss_scale = 128.0});
    EXPECT_TRUE(train_step(*a, *model, opt, images(0, 4, 4), labels(0, 4, 3)));
    EXPECT_TRUE(train_step(*a, *model, opt, images(1, 4, 4), labels(1, 4, 3)));
    EXPECT_EQ(a->scaler().get_scale(), 128.0);
    EXPECT_FALSE(a->scaler().options().dynamic);
  }
  {
    auto model = conv_bn_net(/*seed=*/1);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    auto a = amp::initialize(*model, {&opt}, OptLevel::O1, DType::Float16,
                             {.min_loss_scale = 16384.0, .max_loss_scale = 32768.0});
    EXPECT_EQ(a->scaler().get_scale(), 32768.0);
    const Tensor overflow = images(0, 4, 4) * 131072.0;  // 2^17 is inf in float16
    for (int it = 0; it < 3; ++it) EXPECT_FALSE(train_step(*a, *model, opt, overflow, labels(0, 4, 3)));
    EXPECT_EQ(a->scaler().get_scale(), 16384.0);
    EXPECT_EQ(a->scaler().steps_skipped(), 3);
    EXPECT_EQ(opt.skipped_steps(), 3);
  }
  EXPECT_NE(error_of([] {
              amp::properties_for(OptLevel::O1, DType::Float16, {.keep_batchnorm_fp32 = true});
            }).find("keep_batchnorm_fp32 needs cast_model_type"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              amp::properties_for(OptLevel::O2, DType::Float16, {.cast_model_type = DType::BFloat16});
            }).find("cast_model_type must be float32 or float16, got bfloat16"),
            std::string::npos);
  EXPECT_NE(error_of([] { amp::properties_for(OptLevel::O1, DType::Float16, {.loss_scale = -2.0}); }).find("got -2"),
            std::string::npos);
  // The scale is typed (no string parsed back): O0 and O3 fix it at 1, O1 leaves it dynamic, an override replaces it.
  EXPECT_EQ(amp::to_string(amp::properties_for(OptLevel::O0, DType::Float16).loss_scale), "1");
  EXPECT_EQ(amp::to_string(amp::properties_for(OptLevel::O3, DType::Float16).loss_scale), "1");
  EXPECT_TRUE(amp::properties_for(OptLevel::O1, DType::Float16).loss_scale.is_dynamic());
  EXPECT_EQ(amp::to_string(amp::properties_for(OptLevel::O1, DType::Float16, {.loss_scale = 0.5}).loss_scale), "0.5");
  EXPECT_NE(error_of([] { amp::properties_for(OptLevel::O1, DType::Float32); }).find("float32"), std::string::npos);
  EXPECT_NE(error_of([] { amp::parse_opt_level("O4"); }).find("\"O4\""), std::string::npos);
  EXPECT_EQ(amp::parse_opt_level("O3"), OptLevel::O3);
}

TEST(AmpInitialize, EvaluationOnlyWithoutOptimizers) {
  for (OptLevel level : kLevels) {
    SCOPED_TRACE(amp::opt_level_name(level));
    auto model = conv_bn_net(/*seed=*/1);
    auto a = amp::initialize(*model, {}, level, DType::BFloat16);
    const bool cast = level == OptLevel::O2 || level == OptLevel::O3;
    EXPECT_EQ(a->properties().cast_model_type, cast ? std::optional<DType>(DType::BFloat16) : std::nullopt);
    EXPECT_EQ(a->scaler().get_scale(), 1.0);
    EXPECT_EQ(a->scaler().steps_skipped(), 0);
    model->eval();
    NoGradGuard no_grad;
    auto fw = a->forward();
    const Tensor logits = (*model)(images(0, 2, 4));
    EXPECT_EQ(logits.dtype(), level == OptLevel::O1 ? DType::BFloat16 : DType::Float32);
    for (float v : logits.to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
  }
}

// SimpleCNN at O2 float16 with Adam; an overflow is forced at iteration 2 (inputs times 2^17).
struct CnnRun {
  std::shared_ptr<models::SimpleCNN> model;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<amp::Amp> amp;
};

CnnRun make_run(uint64_t seed) {
  manual_seed(seed);
  CnnRun r;
  r.model = models::simple_cnn(3, 8, 8, /*num_classes=*/4);
  r.opt = std::make_unique<optim::Adam>(r.model->parameters(), optim::AdamOptions{.lr = 1e-2});
  // The scale starts at max_loss_scale 2^10, low enough that only the forced overflow overflows.
  r.amp = amp::initialize(*r.model, {r.opt.get()}, OptLevel::O2, DType::Float16, {.max_loss_scale = 1024.0});
  return r;
}

void train_iterations(CnnRun& r, int from, int to) {
  for (int it = from; it < to; ++it) {
    const Tensor x = it == 2 ? images(it, 4, 8) * 131072.0 : images(it, 4, 8);
    EXPECT_EQ(train_step(*r.amp, *r.model, *r.opt, x, labels(it, 4, 4)), it != 2) << "iteration " << it;
  }
}

TEST(AmpInitialize, CheckpointAtStepFiveResumesBitForBit) {
  CnnRun straight = make_run(/*seed=*/5);
  train_iterations(straight, 0, 10);

  CnnRun first = make_run(/*seed=*/5);
  train_iterations(first, 0, 5);
  const StateDict model_sd = first.amp->model_state_dict();
  for (const auto& [name, t] : model_sd) EXPECT_FALSE(is_16bit_float(t.dtype())) << name << ": masters are saved";
  const test::ScratchDir dir;
  save_safetensors(dir + "/amp_model.safetensors", model_sd);
  const amp::PrecisionState ps = first.amp->precision_state();
  save_safetensors(dir + "/amp_precision.safetensors", ps.tensors, ps.metadata);

  CnnRun resumed = make_run(/*seed=*/99);  // fresh objects, other initial weights
  resumed.model->load_state_dict(load_safetensors(dir + "/amp_model.safetensors").tensors);
  LoadedTensors loaded = load_safetensors(dir + "/amp_precision.safetensors");
  resumed.amp->load_precision_state({loaded.tensors, loaded.metadata});
  EXPECT_EQ(resumed.amp->scaler().get_scale(), 512.0);  // backed off once, mid growth interval
  EXPECT_EQ(resumed.amp->scaler().growth_tracker(), 2);
  train_iterations(resumed, 5, 10);

  const auto want = straight.model->named_parameters(), got = resumed.model->named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(test::bit_equal(got[k].second, want[k].second)) << want[k].first;
  const StateDict want_opt = straight.opt->state_dict(), got_opt = resumed.opt->state_dict();
  ASSERT_EQ(want_opt.size(), got_opt.size());
  for (const auto& [key, t] : want_opt) EXPECT_TRUE(test::bit_equal(got_opt.at(key), t)) << key;
  EXPECT_EQ(resumed.amp->scaler().get_scale(), straight.amp->scaler().get_scale());
  EXPECT_EQ(resumed.amp->scaler().growth_tracker(), 7);
  EXPECT_EQ(straight.amp->scaler().growth_tracker(), 7);
  EXPECT_EQ(resumed.amp->scaler().steps_skipped(), 1);
  EXPECT_EQ(resumed.opt->skipped_steps(), straight.opt->skipped_steps());
}

TEST(AmpInitialize, InputsTimesTwoToTheSeventeenForceOverflowsAndEachScalerEndsAtInitOverTwoToTheK) {
  // Apex's multiple-losses test: two models, two optimizers, two losses, each with its own scaler.
  auto m0 = conv_bn_net(/*seed=*/2), m1 = conv_bn_net(/*seed=*/3);
  optim::SGD o0(m0->parameters(), {.lr = 0.05}), o1(m1->parameters(), {.lr = 0.05});
  nn::Sequential both({m0, m1});
  auto a = amp::initialize(both, {&o0, &o1}, OptLevel::O1, DType::Float16, {}, /*num_losses=*/2);
  const std::set<int> overflow0 = {1, 3, 4}, overflow1 = {2};
  for (int it = 0; it < 6; ++it) {
    const Tensor x = images(it, 4, 4), y = labels(it, 4, 3);
    const Tensor l0 = forward_loss(*a, *m0, overflow0.count(it) ? x * 131072.0 : x, y);
    const Tensor l1 = forward_loss(*a, *m1, overflow1.count(it) ? x * 131072.0 : x, y);
    a->scale_loss(l0, o0, /*loss_id=*/0).backward();
    a->scale_loss(l1, o1, /*loss_id=*/1).backward();
    EXPECT_EQ(a->step(o0), !overflow0.count(it)) << "iteration " << it;
    EXPECT_EQ(a->step(o1), !overflow1.count(it)) << "iteration " << it;
    o0.zero_grad();
    o1.zero_grad();
  }
  EXPECT_EQ(a->scaler(0).get_scale(), 65536.0 / 8);
  EXPECT_EQ(a->scaler(1).get_scale(), 65536.0 / 2);
  EXPECT_EQ(a->scaler(0).steps_skipped(), 3);
  EXPECT_EQ(a->scaler(1).steps_skipped(), 1);
  EXPECT_EQ(o0.step_count(), 3);
  EXPECT_EQ(o1.step_count(), 5);
}

TEST(AmpInitialize, LoadPrecisionStateRejectsLevelDtypeAndParameterMismatches) {
  auto src_model = conv_bn_net(/*seed=*/1);
  optim::Adam src_opt(src_model->parameters(), {.lr = 1e-3});
  auto src = amp::initialize(*src_model, {&src_opt}, OptLevel::O2, DType::Float16);
  train_step(*src, *src_model, src_opt, images(0, 4, 4) * 131072.0, labels(0, 4, 3));  // scale 32768
  train_step(*src, *src_model, src_opt, images(1, 4, 4), labels(1, 4, 3));
  const amp::PrecisionState saved = src->precision_state();

  auto load_into = [&](OptLevel level, DType dtype, int64_t classes, const amp::PrecisionState& st) {
    auto model = conv_bn_net(/*seed=*/1, classes);
    optim::Adam opt(model->parameters(), {.lr = 1e-3});
    auto a = amp::initialize(*model, {&opt}, level, dtype);
    const std::string err = error_of([&] { a->load_precision_state(st); });
    EXPECT_EQ(a->scaler().get_scale(), dtype == DType::Float16 && level != OptLevel::O0 ? 65536.0 : 1.0) << err;
    EXPECT_TRUE(opt.param_groups()[0].slots[0].state.empty()) << "changed before failing: " << err;
    return err;
  };
  EXPECT_NE(load_into(OptLevel::O1, DType::Float16, 3, saved).find("saved at opt level O2, this run is O1"),
            std::string::npos);
  EXPECT_NE(load_into(OptLevel::O2, DType::BFloat16, 3, saved).find("saved with float16, this run uses bfloat16"),
            std::string::npos);
  EXPECT_NE(load_into(OptLevel::O2, DType::Float16, 5, saved)
                .find("saved \"4.weight:float16[3, 64]\" vs model \"4.weight:float16[5, 64]\""),
            std::string::npos);
  amp::PrecisionState future = saved;
  future.metadata["version"] = "2";
  EXPECT_NE(load_into(OptLevel::O2, DType::Float16, 3, future).find("version 2 is not supported"), std::string::npos);
  amp::PrecisionState foreign = saved;
  foreign.metadata.erase("opt_level");
  EXPECT_NE(load_into(OptLevel::O2, DType::Float16, 3, foreign).find("lacks \"opt_level\""), std::string::npos);

  // The matching run takes everything.
  auto model = conv_bn_net(/*seed=*/1);
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  auto a = amp::initialize(*model, {&opt}, OptLevel::O2, DType::Float16);
  a->load_precision_state(saved);
  EXPECT_EQ(a->scaler().get_scale(), 32768.0);
  EXPECT_EQ(a->scaler().growth_tracker(), 1);
  EXPECT_EQ(opt.skipped_steps(), 1);
}

TEST(AmpAutocast, FunctionalLayersAreSixteenBitAndLossesFloat32) {
  Generator gen(7);
  const Tensor x = randn({2, 3, 5, 5}, DType::Float32, &gen), w = randn({4, 3, 3, 3}, DType::Float32, &gen);
  const Tensor b = randn({4}, DType::Float32, &gen), lw = randn({6, 8}, DType::Float32, &gen);
  const Tensor lx = randn({2, 8}, DType::Float32, &gen), target = tensor({1, 5}, Shape{2}, DType::Int64);
  for (DType lo : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(lo));
    const Tensor conv_hand = F::conv2d(x.to(lo), w.to(lo), b.to(lo), {1, 1}, {1, 1});
    const Tensor lin_hand = F::linear(lx.to(lo), lw.to(lo));
    const Tensor ce_hand = F::cross_entropy(lin_hand.float_(), target);
    amp::AutocastGuard guard(lo);
    const Tensor conv = F::conv2d(x, w, b, {1, 1}, {1, 1});
    const Tensor lin = F::linear(lx, lw);
    const Tensor ce = F::cross_entropy(lin, target);
    EXPECT_EQ(conv.dtype(), lo);
    EXPECT_EQ(lin.dtype(), lo);
    EXPECT_EQ(ce.dtype(), DType::Float32);
    EXPECT_TRUE(test::bit_equal(conv, conv_hand));
    EXPECT_TRUE(test::bit_equal(lin, lin_hand));
    EXPECT_TRUE(test::bit_equal(ce, ce_hand));
    const Tensor probs = sigmoid(lin), soft = rand({2, 6}, DType::Float32, &gen);
    EXPECT_NE(error_of([&] { F::binary_cross_entropy(probs, soft); }).find("binary_cross_entropy_with_logits"),
              std::string::npos);
    EXPECT_EQ(F::binary_cross_entropy_with_logits(lin, soft).dtype(), DType::Float32);
  }
}

// Linear regression y = x A^T + c with the loss multiplied by 2^-24, so that the float16 gradients of the
// outputs are ~1e-9 (below float16's smallest subnormal, 6e-8); SGD's lr is multiplied by 2^24 to compensate.
struct Regression {
  Tensor x, y;
  Regression() {
    Generator gen(11);
    x = randn({16, 8}, DType::Float32, &gen);
    y = add(mm(x, randn({4, 8}, DType::Float32, &gen).t()), 0.5);
  }
};

// The true (unscaled) loss of each of `steps` iterations, then the final one.
std::vector<double> regression_losses(OptLevel level, const amp::Overrides& ov, int steps) {
  const Regression data;
  manual_seed(3);
  auto model = std::make_shared<nn::Linear>(8, 4);
  const double down = std::ldexp(1.0, -24);
  optim::SGD opt(model->parameters(), {.lr = 1.0 / down});
  auto a = amp::initialize(*model, {&opt}, level, DType::Float16, ov);
  std::vector<double> losses;
  for (int it = 0; it <= steps; ++it) {
    const Tensor loss = F::mse_loss((*model)(data.x), data.y);
    losses.push_back(loss.item());
    if (it == steps) break;
    a->scale_loss(loss * down, opt).backward();
    a->step(opt);
    opt.zero_grad();
  }
  return losses;
}

TEST(AmpInitialize, LossScalingKeepsFloat16GradientsFromUnderflowing) {
  const int steps = 60;
  const std::vector<double> fp32 = regression_losses(OptLevel::O0, {}, steps);
  const std::vector<double> unscaled = regression_losses(OptLevel::O2, {.loss_scale = 1.0}, steps);
  const std::vector<double> scaled = regression_losses(OptLevel::O2, {}, steps);
  std::printf("loss after %d steps: float32 %.6g, float16 unscaled %.6g, float16 dynamic scaling %.6g (start %.6g)\n",
              steps, fp32.back(), unscaled.back(), scaled.back(), fp32.front());
  EXPECT_LT(fp32.back(), 0.05 * fp32.front());   // the float32 run learns
  EXPECT_EQ(unscaled.back(), unscaled.front());  // every gradient underflowed to 0: not one update
  for (int it = 0; it <= steps; ++it)            // the scaled run tracks float32 step by step
    EXPECT_NEAR(scaled[it], fp32[it], 0.01 * fp32[it] + 1e-3) << "iteration " << it;
}

// y = x a + c with SGD at an lr so small that most updates are below half a bfloat16 ulp of the weights.
std::vector<double> bf16_regression(OptLevel level, std::optional<optim::Rounding> rounding, int steps) {
  Generator gen(13);
  const Tensor x = randn({64, 8}, DType::Float32, &gen);
  const Tensor y = add(mm(x, add(randn({1, 8}, DType::Float32, &gen), 1.0).t()), 2.0);
  manual_seed(4);
  auto model = std::make_shared<nn::Linear>(8, 1);
  optim::SGD opt(model->parameters(), {.lr = 2e-3});
  auto a = amp::initialize(*model, {&opt}, level, DType::BFloat16, {.rounding = rounding, .rounding_seed = 21});
  auto float32_loss = [&] {  // the same weights evaluated in float32
    NoGradGuard no_grad;
    return F::mse_loss(F::linear(x, model->weight.float_(), model->bias.float_()), y).item();
  };
  const double start = float32_loss();
  for (int it = 0; it < steps; ++it) {
    a->scale_loss(F::mse_loss((*model)(x), y), opt).backward();
    a->step(opt);
    opt.zero_grad();
  }
  return {start, float32_loss()};
}

TEST(AmpInitialize, StochasticRoundingLetsPureBFloat16TrainWhereNearestStalls) {
  const int steps = 3000;
  const std::vector<double> fp32 = bf16_regression(OptLevel::O0, std::nullopt, steps);
  const std::vector<double> nearest = bf16_regression(OptLevel::O3, optim::Rounding::Nearest, steps);
  const std::vector<double> stochastic = bf16_regression(OptLevel::O3, optim::Rounding::Stochastic, steps);
  std::printf("loss after %d steps from %.6g: float32 %.6g, pure bf16 nearest %.6g, pure bf16 stochastic %.6g\n", steps,
              fp32[0], fp32[1], nearest[1], stochastic[1]);
  EXPECT_LT(fp32[1], 1e-3 * fp32[0]);
  EXPECT_LT(stochastic[1], 1e-3 * fp32[0]);   // reaches float32's loss ...
  EXPECT_GT(nearest[1], 10 * stochastic[1]);  // ... where rounding to nearest stalls
}

}  // namespace
}  // namespace castor
