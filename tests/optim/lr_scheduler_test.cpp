// LR schedulers against PyTorch 1.13: lr sequences (bit for bit), the call-order warning, state dict round trips, validation.
#include "castor/log.h"
#include "castor/lr_scheduler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "oracle_files.h"

namespace castor::optim {
namespace {

using test::read_oracle_tensor;

const std::vector<double> kGroupLrs = {0.1, 0.02};

// SGD with one single-element parameter per group, at kGroupLrs.
std::unique_ptr<SGD> make_sgd() {
  SGDOptions o;
  o.lr = kGroupLrs[0];
  auto opt = std::make_unique<SGD>(std::vector<Tensor>{zeros({1}).requires_grad_()}, o);
  for (size_t g = 1; g < kGroupLrs.size(); ++g) opt->add_param_group({zeros({1}).requires_grad_()}, kGroupLrs[g], 0);
  return opt;
}

struct SchedulerCase {
  std::string name, kind, args_json;  // the oracle's scheduler kind and constructor arguments
  int steps;
  std::function<std::unique_ptr<LRScheduler>(Optimizer&)> make;
};
// gtest prints a parameter by name in test listings instead of dumping its bytes.
void PrintTo(const SchedulerCase& c, std::ostream* os) { *os << c.name; }

std::string oracle_json(const SchedulerCase& c) {
  std::ostringstream o;
  o.precision(17);
  o << "{\"lrs\": [" << kGroupLrs[0] << ", " << kGroupLrs[1] << "], \"steps\": " << c.steps << ", \"kind\": \""
    << c.kind << "\", \"args\": " << c.args_json << "}";
  return o.str();
}

// The lrs after construction and after each of `steps` optimizer.step(); scheduler.step() pairs, from `k0` on.
void run(Optimizer& opt, LRScheduler& sched, int k0, int steps, std::vector<std::vector<double>>& lrs) {
  if (k0 == 0) lrs.push_back(sched.get_last_lr());
  for (int k = k0; k < steps; ++k) {
    opt.step();
    sched.step();
    lrs.push_back(sched.get_last_lr());
  }
}

class SchedulerVsTorch : public ::testing::TestWithParam<SchedulerCase> {};

TEST_P(SchedulerVsTorch, LrSequenceAndStateDictRoundTrip) {
  const SchedulerCase& c = GetParam();
  const test::ScratchDir dir;
  test::run_optim_oracle("scheduler", oracle_json(c), dir);
  const int groups = static_cast<int>(kGroupLrs.size());
  const std::vector<double> expected =
      read_oracle_tensor(dir, "lrs", {c.steps + 1, groups}, DType::Float64).to_vector<double>();
  auto opt = make_sgd();
  auto sched = c.make(*opt);
  std::vector<std::vector<double>> lrs;
  run(*opt, *sched, 0, c.steps, lrs);
  ASSERT_EQ(lrs.size(), static_cast<size_t>(c.steps + 1));
  for (int k = 0; k <= c.steps; ++k)
    for (int g = 0; g < groups; ++g) {
      EXPECT_EQ(lrs[k][g], expected[k * groups + g]) << "step " << k << ", group " << g;
      EXPECT_EQ(opt->param_groups()[g].lr, lrs.back()[g]);
    }
  // Save mid-run, rebuild both, load (optimizer first, as in PyTorch) and continue: the same lrs.
  auto opt_a = make_sgd();
  auto sched_a = c.make(*opt_a);
  std::vector<std::vector<double>> resumed;
  const int half = c.steps / 2;
  run(*opt_a, *sched_a, 0, half, resumed);
  const StateDict opt_sd = opt_a->state_dict(), sched_sd = sched_a->state_dict();
  auto opt_b = make_sgd();
  auto sched_b = c.make(*opt_b);
  opt_b->load_state_dict(opt_sd);
  sched_b->load_state_dict(sched_sd);
  EXPECT_EQ(sched_b->last_epoch(), half);
  run(*opt_b, *sched_b, half, c.steps, resumed);
  EXPECT_EQ(resumed, lrs);
}

std::vector<SchedulerCase> cases() {
  return {
      {"step", "step", "{\"step_size\": 7, \"gamma\": 0.5}", 30,
       [](Optimizer& o) { return std::make_unique<StepLR>(o, /*step_size=*/7, /*gamma=*/0.5); }},
      {"cosine", "cosine", "{\"t_max\": 10, \"eta_min\": 0.001}", 30,
       [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, /*t_max=*/10, /*eta_min=*/0.001); }},
      {"onecycle", "onecycle",
       "{\"max_lr\": [0.5, 0.1], \"total_steps\": 30, \"pct_start\": 0.3, \"anneal\": \"cos\", \"div_factor\": 25.0, "
       "\"final_div_factor\": 10000.0, \"three_phase\": false}",
       30,
       [](Optimizer& o) {
         OneCycleLROptions opts;
         opts.max_lr = {0.5, 0.1};
         opts.total_steps = 30;
         return std::make_unique<OneCycleLR>(o, opts);
       }},
      {"onecycle_three_phase_linear", "onecycle",
       "{\"max_lr\": 0.3, \"total_steps\": 25, \"pct_start\": 0.25, \"anneal\": \"linear\", \"div_factor\": 10.0, "
       "\"final_div_factor\": 100.0, \"three_phase\": true}",
       25,
       [](Optimizer& o) {
         OneCycleLROptions opts;
         opts.max_lr = {0.3};
         opts.total_steps = 25;
         opts.pct_start = 0.25;
         opts.anneal = OneCycleLROptions::Anneal::Linear;
         opts.div_factor = 10;
         opts.final_div_factor = 100;
         opts.three_phase = true;
         return std::make_unique<OneCycleLR>(o, opts);
       }},
      {"warmup", "warmup", "{\"warmup_steps\": 10, \"start_factor\": 0.1}", 30,
       [](Optimizer& o) { return std::make_unique<LinearWarmup>(o, /*warmup_steps=*/10, /*start_factor=*/0.1); }},
  };
}
INSTANTIATE_TEST_SUITE_P(Schedulers, SchedulerVsTorch, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(LRScheduler, CallOrderWarningLikePyTorchButNotForSkippedSteps) {
  const test::ScratchDir dir;
  test::run_optim_oracle("warning",
                         "{\"lrs\": [0.1], \"kind\": \"step\", \"args\": {\"step_size\": 3, \"gamma\": 0.1}}", dir);
  std::ifstream f(dir + "/warning.txt");
  std::string torch_message;
  std::getline(f, torch_message);
  ASSERT_NE(torch_message.find("before `optimizer.step()`"), std::string::npos) << torch_message;

  // PyTorch warns in the first case only; Castor says so in its own words, through the warning hook.
  std::vector<std::string> warnings;
  const LogHandler previous = set_log_handler([&](const std::string& m) { warnings.push_back(m); });
  auto opt = make_sgd();
  StepLR wrong_order(*opt, /*step_size=*/3);
  wrong_order.step();
  wrong_order.step();
  ASSERT_EQ(warnings.size(), 1u);  // once
  EXPECT_NE(warnings[0].find("lr_scheduler.step() was called before optimizer.step()"), std::string::npos);

  warnings.clear();
  StepLR right_order(*opt, /*step_size=*/3);
  opt->step();
  right_order.step();
  EXPECT_TRUE(warnings.empty());

  StepLR after_skip(*opt, /*step_size=*/3);
  opt->note_skipped_step();  // a GradScaler found inf/NaN gradients and skipped optimizer.step()
  after_skip.step();
  EXPECT_TRUE(warnings.empty());
  set_log_handler(previous);
  EXPECT_EQ(opt->skipped_steps(), 1);
}

TEST(LRScheduler, Validation) {
  auto opt = make_sgd();
  EXPECT_THROW(StepLR(*opt, /*step_size=*/0), Error);
  EXPECT_THROW(CosineAnnealingLR(*opt, /*t_max=*/0), Error);
  EXPECT_THROW(LinearWarmup(*opt, /*warmup_steps=*/5, /*start_factor=*/0.0), Error);
  OneCycleLROptions opts;
  opts.max_lr = {0.1, 0.2, 0.3};
  opts.total_steps = 4;
  EXPECT_THROW(OneCycleLR(*opt, opts), Error);  // three max_lr values for two groups
  opts.max_lr = {0.1};
  OneCycleLR one_cycle(*opt, opts);
  for (int k = 0; k < 4; ++k) {
    opt->step();
    one_cycle.step();
  }
  const std::vector<double> last = one_cycle.get_last_lr();
  test::expect_error([&] { one_cycle.step(); }, {"total steps is 4"});
  EXPECT_EQ(one_cycle.get_last_lr(), last);
  EXPECT_EQ(one_cycle.last_epoch(), 4);
  StateDict sd = one_cycle.state_dict();
  sd.erase("last_epoch");
  sd["extra"] = scalar_tensor(0, DType::Int64);
  test::expect_error([&] { one_cycle.load_state_dict(sd); }, {"last_epoch"});
}

}  // namespace
}  // namespace castor::optim
