// GradScaler with real optimizers: PyTorch's scaler tests (overflow script, contracts, state dicts, multiple
// optimizers, clipping, accumulation, inf injection against a float32 control) and the case for loss scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "castor/autograd.h"
#include "castor/grad_scaler.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// Clones of one set of parameters, so that a scaled run and a float32 control start equal.
std::vector<Tensor> clone_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// A 2-layer MLP on explicit parameters {w1 (8, 4), w2 (3, 8)}.
Tensor mlp(const std::vector<Tensor>& p, const Tensor& x) { return mm(relu(mm(x, p[0].t())), p[1].t()); }

std::vector<Tensor> mlp_params(uint64_t seed) {
  Generator gen(seed);
  return {randn({8, 4}, DType::Float32, &gen).mul_(0.5).requires_grad_(),
          randn({3, 8}, DType::Float32, &gen).mul_(0.5).requires_grad_()};
}

Tensor batch(int i) {
  Generator gen(100 + i);
  return randn({5, 4}, DType::Float32, &gen);
}

TEST(GradScaler, DeterministicOverflowScript) {
  // PyTorch's graph grad-scaling test: weight of ones, loss = sum(weight * input), init_scale 4.
  Tensor w = ones({100}, DType::Float16).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  amp::GradScalerOptions o;
  o.init_scale = 4.0;
  amp::GradScaler scaler(o);
  const std::vector<double> inputs = {5, 20000, 5, 40000};
  const std::vector<double> scales = {4, 2, 2, 1}, trackers = {1, 0, 1, 0}, grads = {20, kInf, 10, kInf};
  const std::vector<double> weights = {0.5, 0.5, 0.0, 0.0};  // SGD by hand: 1 - 0.1 * 5, skip, - 0.1 * 5, skip
  for (size_t k = 0; k < inputs.size(); ++k) {
    opt.zero_grad();
    Tensor input = full({100}, inputs[k], DType::Float16);
    scaler.scale(sum(w * input)).backward();
    EXPECT_EQ(w.grad().dtype(), DType::Float16);
    EXPECT_TRUE(test::bit_equal(w.grad(), full({100}, grads[k], DType::Float16))) << "iteration " << k;
    EXPECT_EQ(scaler.step(opt), std::isfinite(grads[k]));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scales[k]);
    EXPECT_EQ(scaler.growth_tracker(), trackers[k]);
    EXPECT_EQ(w.to_vector<float>(), std::vector<float>(100, weights[k])) << "iteration " << k;
  }
  EXPECT_EQ(scaler.steps_taken(), 2);
  EXPECT_EQ(scaler.steps_skipped(), 2);
  EXPECT_EQ(opt.skipped_steps(), 2);
  EXPECT_EQ(opt.step_count(), 2);
  ASSERT_EQ(scaler.scale_history().size(), 3u);  // 4 at the start, 2 after update 2, 1 after update 4
  EXPECT_EQ(scaler.scale_history()[1].update, 2);
  EXPECT_EQ(scaler.scale_history()[2].scale, 1.0);
  EXPECT_EQ(scaler.nonfinite_params(), (std::vector<std::string>{"group 0 param 0"}));
}

TEST(GradScaler, ContractErrors) {
  Tensor w = ones({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  amp::GradScaler scaler;
  EXPECT_THROW(scaler.update(), Error);  // no inf checks recorded
  scaler.scale(sum(w)).backward();
  scaler.unscale_(opt);
  EXPECT_THROW(scaler.unscale_(opt), Error);  // twice before update
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_THROW(scaler.unscale_(opt), Error);  // after step
  EXPECT_THROW(scaler.step(opt), Error);      // step twice
  scaler.update();
  opt.zero_grad();
  scaler.scale(sum(w)).backward();
  EXPECT_TRUE(scaler.step(opt));  // step without unscale_ unscales itself
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 2);
}

TEST(GradScaler, StateDictLoadOverwritesEverything) {
  amp::GradScalerOptions a_opts;
  a_opts.init_scale = 3.0;
  a_opts.growth_factor = 4.0;
  a_opts.backoff_factor = 0.5;
  a_opts.growth_interval = 2;
  a_opts.hysteresis = 3;
  amp::GradScaler a(a_opts);
  Tensor w = ones({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  a.scale(sum(w)).backward();
  a.step(opt);
  a.update();  // tracker 1
  amp::GradScalerOptions b_opts;
  b_opts.init_scale = 2.0;
  b_opts.growth_factor = 3.0;
  b_opts.backoff_factor = 0.75;
  b_opts.growth_interval = 1;
  amp::GradScaler b(b_opts);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.get_scale(), 3.0);
  EXPECT_EQ(b.options().growth_factor, 4.0);
  EXPECT_EQ(b.options().backoff_factor, 0.5);
  EXPECT_EQ(b.options().growth_interval, 2);
  EXPECT_EQ(b.options().hysteresis, 3);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.steps_taken(), 1);

  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler disabled(off);
  EXPECT_TRUE(disabled.state_dict().empty());
  EXPECT_THROW(b.load_state_dict(disabled.state_dict()), Error);
  StateDict missing = a.state_dict();
  missing.erase("growth_tracker");
  EXPECT_THROW(b.load_state_dict(missing), Error);
}

TEST(GradScaler, BFloat16DefaultsToDisabledAndTheLoopStillRuns) {
  amp::GradScalerOptions o;
  o.dtype = DType::BFloat16;
  amp::GradScaler scaler(o);
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  Tensor w = ones({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.5});
  Tensor loss = sum(w);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.5, 0.5}));
  o.enabled = true;  // forced on
  EXPECT_TRUE(amp::GradScaler(o).is_enabled());
}

// Runs 4 iterations of the MLP with SGD; `inject` puts an inf into w2's gradient at iteration 2. With a
// scaler the step is skipped there; the control (no scaler) skips it by not stepping.
struct RunResult {
  std::vector<Tensor> params;
  double scale;
};
RunResult run_mlp(bool scaled, bool inject, bool save_restore_each_iteration) {
  std::vector<Tensor> p = mlp_params(1);
  optim::SGD opt(p, {.lr = 0.1, .momentum = 0.9});
  amp::GradScalerOptions o;
  o.init_scale = 1024.0;
  o.growth_interval = 1;  // grows on each clean step
  o.enabled = scaled;
  auto scaler = std::make_unique<amp::GradScaler>(o);
  for (int i = 0; i < 4; ++i) {
    opt.zero_grad();
    Tensor loss = mean(pow(mlp(p, batch(i)), 2.0));
    scaler->scale(loss).backward();
    const bool bad = inject && i == 2;
    if (bad) p[1].grad().narrow(/*dim=*/0, /*start=*/1, /*length=*/1).fill_(kInf);
    if (scaled) {
      EXPECT_EQ(scaler->step(opt), !bad);
      scaler->update();
    } else if (!bad) {
      opt.step();
    }
    if (save_restore_each_iteration) {
      StateDict sd = scaler->state_dict();
      scaler = std::make_unique<amp::GradScaler>(o);
      scaler->load_state_dict(sd);
    }
  }
  return {p, scaler->get_scale()};
}

TEST(GradScaler, InfAtIterationTwoMatchesAFloat32ControlThatSkipsIt) {
  const RunResult control = run_mlp(/*scaled=*/false, /*inject=*/true, false);
  const RunResult amp_run = run_mlp(/*scaled=*/true, /*inject=*/true, false);
  const RunResult restored = run_mlp(/*scaled=*/true, /*inject=*/true, /*save_restore=*/true);
  for (size_t k = 0; k < control.params.size(); ++k) {
    EXPECT_TRUE(test::bit_equal(amp_run.params[k], control.params[k]));  // power-of-two scales are exact
    EXPECT_TRUE(test::bit_equal(restored.params[k], control.params[k]));
  }
  EXPECT_EQ(amp_run.scale, 1024.0 * 2 * 2 * 0.5 * 2);  // growths on the clean steps, one backoff
  EXPECT_EQ(restored.scale, amp_run.scale);
  EXPECT_EQ(control.scale, 1.0);  // disabled scaler: scale 1, same user code
}

TEST(GradScaler, TwoModelsTwoOptimizersTwoLosses) {
  // An inf in model 1's gradients skips only optimizer 1; the shared scale backs off once.
  std::vector<Tensor> p1 = mlp_params(2), p2 = mlp_params(3);
  std::vector<Tensor> c1 = clone_params(p1), c2 = clone_params(p2);
  optim::SGD o1(p1, {.lr = 0.1}), o2(p2, {.lr = 0.1}), k1(c1, {.lr = 0.1}), k2(c2, {.lr = 0.1});
  amp::GradScalerOptions opts;
  opts.init_scale = 256.0;
  amp::GradScaler scaler(opts, {{"model1.w1", p1[0]}, {"model1.w2", p1[1]}});
  for (int i = 0; i < 3; ++i) {
    for (auto* o : {&o1, &o2, &k1, &k2}) o->zero_grad();
    Tensor x = batch(i);
    Tensor out1 = mlp(p1, x), out2 = mlp(p2, x);
    Tensor l1 = mean(pow(out1 - out2.detach(), 2.0)), l2 = mean(pow(out2, 2.0));
    for (const Tensor& l : scaler.scale(std::vector<Tensor>{l1, l2})) l.backward();
    mean(pow(mlp(c1, x) - mlp(c2, x).detach(), 2.0)).backward();
    mean(pow(mlp(c2, x), 2.0)).backward();
    const bool bad = i == 1;
    if (bad) p1[0].grad().narrow(/*dim=*/1, /*start=*/2, /*length=*/1).fill_(std::nan(""));
    EXPECT_EQ(scaler.step(o1), !bad);
    EXPECT_TRUE(scaler.step(o2));
    EXPECT_EQ(scaler.found_inf(o1), bad);
    EXPECT_FALSE(scaler.found_inf(o2));
    if (bad) {
      EXPECT_EQ(scaler.nonfinite_params(), (std::vector<std::string>{"model1.w1"}));
    }
    scaler.update();
    if (!bad) k1.step();
    k2.step();
  }
  EXPECT_EQ(scaler.get_scale(), 128.0);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(test::close(p1[k], c1[k], 1e-6, 1e-7));
    EXPECT_TRUE(test::close(p2[k], c2[k], 1e-6, 1e-7));
  }
}

TEST(GradScaler, ClippingAfterUnscaleMatchesTheControlAndStillSkipsOnInf) {
  std::vector<Tensor> p = mlp_params(4), c = clone_params(p);
  optim::SGD opt(p, {.lr = 0.1}), control(c, {.lr = 0.1});
  amp::GradScaler scaler;
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    control.zero_grad();
    scaler.scale(mean(pow(mlp(p, batch(i)), 2.0))).backward();
    mean(pow(mlp(c, batch(i)), 2.0)).backward();
    const bool bad = i == 2;
    if (bad) p[0].grad().narrow(/*dim=*/0, /*start=*/0, /*length=*/1).fill_(kInf);
    scaler.unscale_(opt);
    const double norm = amp::clip_grad_norm_(opt, /*max_norm=*/0.05);
    const double control_norm = amp::clip_grad_norm_(c, /*max_norm=*/0.05);
    if (!bad) {
      EXPECT_NEAR(norm, control_norm, 1e-6 * control_norm);
    }
    EXPECT_GT(control_norm, 0.05);  // the clip is active
    EXPECT_EQ(scaler.step(opt), !bad);
    scaler.update();
    if (!bad) control.step();
  }
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(test::close(p[k], c[k], 1e-5, 1e-7));
}

TEST(GradScaler, GradientAccumulationOverTwoMicroBatches) {
  std::vector<Tensor> p = mlp_params(5), c = clone_params(p);
  optim::SGD opt(p, {.lr = 0.1}), control(c, {.lr = 0.1});
  amp::GradScaler scaler;
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    control.zero_grad();
    for (int micro = 0; micro < 2; ++micro) scaler.scale(mean(pow(mlp(p, batch(2 * i + micro)), 2.0)) * 0.5).backward();
    mean(pow(mlp(c, cat({batch(2 * i), batch(2 * i + 1)})), 2.0)).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    control.step();
  }
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(test::close(p[k], c[k], 1e-5, 1e-7));
}

TEST(GradScaler, SixteenBitGradientsAreUnscaledIntoFloat32MasterGradients) {
  // The reason for loss scaling: float16 gradients of ~1e-8 underflow to 0 unless the loss is scaled.
  Tensor w = full({4}, 1.0, DType::Float16).requires_grad_();
  optim::SGD opt({w}, {.lr = 1000.0});
  opt.set_master_weights(true);
  const Tensor x = full({4}, 1e-8, DType::Float32);
  sum(w.float_() * x).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>(4, 0.0f)));  // underflowed
  opt.zero_grad();
  amp::GradScaler scaler;  // 2^16: 1e-8 * 65536 = 6.6e-4 is a normal float16
  scaler.scale(sum(w.float_() * x)).backward();
  scaler.unscale_(opt);
  const optim::ParamSlot& slot = opt.param_groups()[0].slots[0];
  ASSERT_TRUE(slot.staged_grad().defined());
  EXPECT_EQ(slot.staged_grad().dtype(), DType::Float32);
  EXPECT_TRUE(test::close(slot.staged_grad(), full({4}, 1e-8), 1e-3, 0));
  EXPECT_TRUE(opt.staged_grads()[0].is_same(slot.staged_grad()));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(test::close(slot.master, full({4}, 1.0 - 1e-5), 0, 1e-7));  // the float32 master moved ...
  EXPECT_TRUE(test::bit_equal(w, full({4}, 1.0, DType::Float16)));        // ... by less than float16 resolves
}

}  // namespace
}  // namespace castor
