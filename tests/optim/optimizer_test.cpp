// Optimizers against PyTorch 1.13 (bit for bit): SGD/Adam/AdamW trajectories and state, state dicts, 16-bit params, stochastic rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <fstream>
#include <sstream>

#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "oracle_files.h"

namespace castor::optim {
namespace {

using test::bit_equal;
using test::read_oracle_tensor;

struct GroupSpec {
  std::vector<int> params;  // indices into Config::shapes
  double lr, weight_decay;
};

// One optimizer run, described once for both PyTorch (as JSON) and Castor.
struct Config {
  std::string name;
  std::string kind;  // "sgd", "adam" or "adamw"
  SGDOptions sgd;
  AdamOptions adam;
  std::vector<GroupSpec> groups;
  std::vector<Shape> shapes = {{4, 5}, {7}};
  int steps = 10;
  std::string values_dtype;  // initial weights and gradients made representable in this dtype
  std::string round_to;      // the oracle rounds weights to this dtype after each step
};
// gtest prints a parameter by name in test listings instead of dumping its bytes.
void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

std::string to_json(const Config& c) {
  std::ostringstream o;
  o.precision(17);
  auto list = [&](const auto& xs) {
    o << "[";
    for (size_t i = 0; i < xs.size(); ++i) o << (i ? ", " : "") << xs[i];
    o << "]";
  };
  auto flag = [](bool b) { return b ? "true" : "false"; };
  o << "{\"seed\": 7, \"steps\": " << c.steps << ", \"kind\": \"" << c.kind << "\", \"values_dtype\": \""
    << c.values_dtype << "\", \"round_to\": \"" << c.round_to << "\", \"shapes\": [";
  for (size_t j = 0; j < c.shapes.size(); ++j) {
    o << (j ? ", " : "");
    list(c.shapes[j]);
  }
  o << "], \"groups\": [";
  for (size_t g = 0; g < c.groups.size(); ++g) {
    o << (g ? ", " : "") << "{\"params\": ";
    list(c.groups[g].params);
    o << ", \"lr\": " << c.groups[g].lr << ", \"weight_decay\": " << c.groups[g].weight_decay << "}";
  }
  o << "], \"options\": {\"momentum\": " << c.sgd.momentum << ", \"dampening\": " << c.sgd.dampening
    << ", \"nesterov\": " << flag(c.sgd.nesterov) << ", \"beta1\": " << c.adam.beta1 << ", \"beta2\": " << c.adam.beta2
    << ", \"eps\": " << c.adam.eps << ", \"amsgrad\": " << flag(c.adam.amsgrad) << "}}";
  return o.str();
}

// The oracle's files for one config: initial weights, gradients per step, weights after each step, final state.
struct Oracle {
  const Config& c;
  const test::ScratchDir dir;
  explicit Oracle(const Config& config) : c(config) { test::run_optim_oracle("optimizer", to_json(c), dir); }
  Tensor init(int j) const { return read_oracle_tensor(dir, "init_" + std::to_string(j), c.shapes[j]); }
  Tensor grad(int k, int j) const {
    return read_oracle_tensor(dir, "grad_" + std::to_string(k) + "_" + std::to_string(j), c.shapes[j]);
  }
  Tensor weight(int k, int j) const {
    return read_oracle_tensor(dir, "weight_" + std::to_string(k) + "_" + std::to_string(j), c.shapes[j]);
  }
  std::vector<std::string> state_names(int j) const {
    std::ifstream f(dir + "/state_" + std::to_string(j) + ".txt");
    std::vector<std::string> names;
    for (std::string line; std::getline(f, line);) names.push_back(line);
    return names;
  }
  Tensor state(int j, const std::string& name) const {
    return read_oracle_tensor(dir, "state_" + std::to_string(j) + "_" + name, name == "step" ? Shape{} : c.shapes[j]);
  }
};

// Params of `dtype` holding the oracle's initial weights.
std::vector<Tensor> initial_params(const Oracle& o, DType dtype = DType::Float32) {
  std::vector<Tensor> params;
  for (size_t j = 0; j < o.c.shapes.size(); ++j) params.push_back(o.init(j).to(dtype).requires_grad_());
  return params;
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const std::vector<Tensor>& params) {
  auto group_params = [&](const GroupSpec& g) {
    std::vector<Tensor> ps;
    for (int j : g.params) ps.push_back(params[j]);
    return ps;
  };
  const GroupSpec& first = c.groups[0];
  std::unique_ptr<Optimizer> opt;
  if (c.kind == "sgd") {
    SGDOptions o = c.sgd;
    o.lr = first.lr;
    o.weight_decay = first.weight_decay;
    opt = std::make_unique<SGD>(group_params(first), o);
  } else {
    AdamOptions o = c.adam;
    o.lr = first.lr;
    o.weight_decay = first.weight_decay;
    if (c.kind == "adamw")
      opt = make_adamw(group_params(first), o);
    else
      opt = std::make_unique<Adam>(group_params(first), o);
  }
  for (size_t g = 1; g < c.groups.size(); ++g)
    opt->add_param_group(group_params(c.groups[g]), c.groups[g].lr, c.groups[g].weight_decay);
  return opt;
}

// Sets every param's .grad to the oracle's gradient of step k (in the param's dtype) and steps.
void step_with_oracle_grads(Optimizer& opt, const std::vector<Tensor>& params, const Oracle& o, int k) {
  for (size_t j = 0; j < params.size(); ++j) params[j].set_grad(o.grad(k, j).to(params[j].dtype()));
  opt.step();
}

class OptimVsTorch : public ::testing::TestWithParam<Config> {};

TEST_P(OptimVsTorch, TrajectoryStateAndStateDictRoundTrip) {
  const Config& c = GetParam();
  Oracle o(c);
  std::vector<Tensor> params = initial_params(o);
  auto opt = make_optimizer(c, params);
  const int half = c.steps / 2;
  StateDict saved;
  std::vector<Tensor> saved_weights;
  for (int k = 0; k < c.steps; ++k) {
    if (k == half) {
      saved = opt->state_dict();
      for (const Tensor& p : params) saved_weights.push_back(p.detach().clone());
    }
    step_with_oracle_grads(*opt, params, o, k);
    for (size_t j = 0; j < params.size(); ++j)
      ASSERT_TRUE(bit_equal(params[j], o.weight(k, j))) << "step " << k << ", param " << j;
  }
  for (size_t g = 0; g < c.groups.size(); ++g) {
    for (size_t i = 0; i < c.groups[g].params.size(); ++i) {
      const int j = c.groups[g].params[i];
      const auto& state = opt->param_groups()[g].slots[i].state;
      const std::vector<std::string> names = o.state_names(j);
      EXPECT_EQ(state.size(), names.size()) << "param " << j;
      for (const std::string& name : names) {
        ASSERT_TRUE(state.count(name)) << "param " << j << " lacks state " << name;
        EXPECT_TRUE(bit_equal(state.at(name), o.state(j, name))) << "param " << j << ", " << name;
      }
    }
  }
  // A fresh optimizer loaded with the mid-run state dict continues bit for bit.
  for (Tensor& w : saved_weights) w.requires_grad_();
  auto resumed = make_optimizer(c, saved_weights);
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->step_count(), half);
  for (int k = half; k < c.steps; ++k) step_with_oracle_grads(*resumed, saved_weights, o, k);
  for (size_t j = 0; j < params.size(); ++j) EXPECT_TRUE(bit_equal(saved_weights[j], params[j])) << "param " << j;
  const StateDict a = opt->state_dict(), b = resumed->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, t] : a) EXPECT_TRUE(bit_equal(b.at(key), t)) << key;
}

Config sgd(const std::string& name, double momentum, double dampening, bool nesterov, double weight_decay) {
  Config c{name, "sgd"};
  c.sgd.momentum = momentum;
  c.sgd.dampening = dampening;
  c.sgd.nesterov = nesterov;
  c.groups = {{{0, 1}, 0.1, weight_decay}};
  return c;
}
Config adam(const std::string& name, const std::string& kind, bool amsgrad, double weight_decay) {
  Config c{name, kind};
  c.adam.amsgrad = amsgrad;
  c.adam.beta2 = 0.99;
  c.groups = {{{0, 1}, 0.01, weight_decay}};
  return c;
}
std::vector<Config> configs() {
  std::vector<Config> cs = {sgd("sgd_plain", 0, 0, false, 0),
                            sgd("sgd_momentum", 0.9, 0, false, 0),
                            sgd("sgd_nesterov", 0.9, 0, true, 0),
                            sgd("sgd_dampening", 0.9, 0.3, false, 0),
                            sgd("sgd_weight_decay", 0.9, 0, false, 0.05),
                            adam("adam", "adam", false, 0),
                            adam("adam_amsgrad", "adam", true, 0.1),
                            adam("adamw", "adamw", false, 0.05)};
  Config big = adam("adam_large_threaded", "adam", false, 0.01);
  big.shapes = {{300, 200}, {33}};
  cs.push_back(big);
  Config sgd_groups = sgd("sgd_two_groups", 0.9, 0, false, 0);
  sgd_groups.shapes = {{4, 5}, {7}, {3}};
  sgd_groups.groups = {{{0, 2}, 0.1, 0.0}, {{1}, 0.03, 0.02}};
  cs.push_back(sgd_groups);
  Config adamw_groups = adam("adamw_two_groups", "adamw", true, 0);
  adamw_groups.groups = {{{1}, 0.01, 0.1}, {{0}, 0.002, 0.0}};
  cs.push_back(adamw_groups);
  return cs;
}
INSTANTIATE_TEST_SUITE_P(Configs, OptimVsTorch, ::testing::ValuesIn(configs()),
                         [](const auto& info) { return info.param.name; });

TEST(Optim, Bf16WithMasterWeightsMatchesFloat32Run) {
  Config c = adam("adam_bf16_values", "adam", false, 0.01);
  c.values_dtype = "bfloat16";
  Oracle o(c);
  std::vector<Tensor> p32 = initial_params(o), p16 = initial_params(o, DType::BFloat16);
  auto opt32 = make_optimizer(c, p32), opt16 = make_optimizer(c, p16);
  opt16->set_master_weights(true);
  for (int k = 0; k < c.steps; ++k) {
    step_with_oracle_grads(*opt32, p32, o, k);
    step_with_oracle_grads(*opt16, p16, o, k);
    for (size_t j = 0; j < p32.size(); ++j) {
      const Tensor& master = opt16->param_groups()[0].slots[j].master;
      ASSERT_TRUE(bit_equal(p32[j], o.weight(k, j))) << "step " << k << ", param " << j;
      ASSERT_TRUE(bit_equal(master, p32[j])) << "step " << k << ", param " << j;
      ASSERT_TRUE(bit_equal(p16[j], master.bfloat16())) << "step " << k << ", param " << j;
    }
  }
}

TEST(Optim, Fp16ParamsUnderAdamMatchTorchAndStayFiniteWithZeroGradients) {
  // In float16, Adam's eps underflows: naive float16 math would compute 0 / (sqrt(0) + 0) = NaN.
  ASSERT_EQ(static_cast<float>(Half(1e-8f)), 0.0f);
  Config c = adam("adam_fp16", "adam", false, 0);
  c.values_dtype = c.round_to = "float16";
  Oracle o(c);
  std::vector<Tensor> params = initial_params(o, DType::Float16);
  auto opt = make_optimizer(c, params);
  Tensor idle = tensor({0.5, -2.0, 1e-3, 0.0, 6e-8}, DType::Float16).requires_grad_();
  const Tensor idle_start = idle.detach().clone();
  opt->add_param_group({idle}, 0.01, 0.0);
  for (int k = 0; k < c.steps; ++k) {
    idle.set_grad(zeros(idle.shape(), DType::Float16));
    step_with_oracle_grads(*opt, params, o, k);
    for (size_t j = 0; j < params.size(); ++j)
      ASSERT_TRUE(bit_equal(params[j], o.weight(k, j).half())) << "step " << k << ", param " << j;
    ASSERT_TRUE(isfinite_all(idle)) << "step " << k;
    ASSERT_TRUE(bit_equal(idle, idle_start)) << "step " << k;
  }
}

// SGD with lr 1 on a 16-bit parameter of ones and a constant gradient -delta, delta far below the ulp at 1.
struct TinyIncrements {
  DType dtype;
  float delta;
  int steps = 64;
  int64_t n = 4096;
  Tensor run(Rounding rounding, uint64_t seed, std::vector<float>* first_step = nullptr) const {
    Tensor w = ones({n}, dtype).requires_grad_();
    SGDOptions opts;
    opts.lr = 1.0;
    SGD opt({w}, opts);
    opt.set_rounding(rounding, seed);
    for (int k = 0; k < steps; ++k) {
      w.set_grad(full({n}, -delta, DType::Float32).to(dtype));
      opt.step();
      if (k == 0 && first_step) *first_step = w.to_vector<float>();
    }
    return w;
  }
};

void check_stochastic_rounding(DType dtype, float ulp_at_one) {
  const TinyIncrements t{dtype, ulp_at_one / 32};
  // The float32 run is the exact reference.
  const Tensor exact = TinyIncrements{DType::Float32, t.delta}.run(Rounding::Nearest, 0);
  const double exact_mean = mean(exact).item();
  ASSERT_NEAR(exact_mean, 1.0 + t.steps * static_cast<double>(t.delta), 1e-6);
  // Round to nearest stalls: 1 + delta rounds back to 1 every step.
  EXPECT_EQ(mean(t.run(Rounding::Nearest, 0).float_()).item(), 1.0);
  // Stochastic rounding: each element lands on one of the two neighbours, both occur, and the mean is unbiased.
  std::vector<float> first;
  const Tensor a = t.run(Rounding::Stochastic, 42, &first);
  int ups = 0;
  for (float v : first) {
    ASSERT_TRUE(v == 1.0f || v == 1.0f + ulp_at_one) << v;
    ups += v != 1.0f;
  }
  EXPECT_GT(ups, 0);
  EXPECT_LT(ups, t.n / 8);  // probability 1/32
  // The mean of n elements: each has variance <= steps * ulp^2 / 4, so the mean's sd <= sqrt(steps) * ulp / 2 / sqrt(n).
  const double sd = std::sqrt(static_cast<double>(t.steps)) * ulp_at_one / 2 / std::sqrt(static_cast<double>(t.n));
  EXPECT_NEAR(mean(a.float_()).item(), exact_mean, 6 * sd);
  EXPECT_GT(std::abs(1.0 - exact_mean), 30 * sd);  // the stall is far outside that band
  // Reproducible from the seed; another seed differs.
  EXPECT_TRUE(bit_equal(t.run(Rounding::Stochastic, 42), a));
  EXPECT_FALSE(bit_equal(t.run(Rounding::Stochastic, 43), a));
}

TEST(Optim, StochasticRoundingBf16IsUnbiasedAndReproducible) { check_stochastic_rounding(DType::BFloat16, 0x1.0p-7f); }
TEST(Optim, StochasticRoundingFp16IsUnbiasedAndReproducible) { check_stochastic_rounding(DType::Float16, 0x1.0p-10f); }

TEST(Optim, StochasticRoundingEdges) {
  for (auto [dtype, max_finite, ulp] :
       {std::tuple{DType::BFloat16, 0x1.fep127f, 0x1.0p120f}, std::tuple{DType::Float16, 65504.0f, 32.0f}}) {
    // Just below the next power of two: nearest overflows to inf, stochastic saturates at the largest finite value.
    for (Rounding r : {Rounding::Nearest, Rounding::Stochastic}) {
      Tensor w = tensor({max_finite, -max_finite, INFINITY, 1.0, 1.0}, dtype).requires_grad_();
      SGDOptions opts;
      opts.lr = 1.0;
      SGD opt({w}, opts);
      opt.set_rounding(r, 5);
      w.set_grad(tensor({-0.75 * ulp, 0.75 * ulp, 1.0, NAN, -0.5}, DType::Float32).to(dtype));
      opt.step();
      const std::vector<float> v = w.to_vector<float>();
      const float top = r == Rounding::Nearest ? INFINITY : max_finite;
      EXPECT_EQ(v[0], top) << dtype_name(dtype);
      EXPECT_EQ(v[1], -top) << dtype_name(dtype);
      EXPECT_EQ(v[2], INFINITY) << dtype_name(dtype);
      EXPECT_TRUE(std::isnan(v[3])) << dtype_name(dtype);
      EXPECT_EQ(v[4], 1.5f) << dtype_name(dtype);  // exactly representable: no noise
    }
  }
}

TEST(Optim, StagedFloat32GradIsUsedAndCleared) {
  Tensor w = tensor({1.0, 2.0}, DType::BFloat16).requires_grad_();
  SGDOptions opts;
  opts.lr = 0.5;
  SGD opt({w}, opts);
  const ParamSlot& slot = opt.param_groups()[0].slots[0];
  w.set_grad(tensor({100.0, 100.0}, DType::BFloat16));  // ignored while a float32 gradient is staged
  opt.stage_float32_grad(0, 0, tensor({0.25, -1.0}));
  test::expect_error(
      [&] {
        opt.stage_float32_grad(0, 0, tensor({0.25, -1.0}, DType::BFloat16));
      },
      {"not a float32 gradient"});
  test::expect_error([&] { opt.stage_float32_grad(0, 1, tensor({0.25, -1.0})); }, {"no parameter 1 in group 0"});
  opt.step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.875f, 2.5f}));
  EXPECT_FALSE(slot.staged_grad().defined());
  EXPECT_EQ(opt.step_count(), 1);
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  opt.step();  // no gradient: nothing changes, the call still counts
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.875f, 2.5f}));
  EXPECT_EQ(opt.step_count(), 2);
}

TEST(Optim, OptionsAreValidated) {
  std::vector<Tensor> ps = {zeros({2}).requires_grad_()};
  test::expect_error([&] { SGD(ps, SGDOptions{.lr = -1}); }, {"lr"});
  test::expect_error([&] { SGD(ps, SGDOptions{.momentum = -0.5}); }, {"momentum"});
  test::expect_error([&] { SGD(ps, SGDOptions{.nesterov = true}); }, {"nesterov"});
  test::expect_error([&] { SGD(ps, SGDOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }, {"nesterov"});
  test::expect_error([&] { SGD(ps, SGDOptions{.weight_decay = -1}); }, {"weight_decay"});
  test::expect_error([&] { Adam(ps, AdamOptions{.lr = -1e-3}); }, {"lr"});
  test::expect_error([&] { Adam(ps, AdamOptions{.beta1 = 1.0}); }, {"beta1"});
  test::expect_error([&] { Adam(ps, AdamOptions{.beta2 = -0.1}); }, {"beta2"});
  test::expect_error([&] { Adam(ps, AdamOptions{.eps = -1e-8}); }, {"eps"});
  SGD opt(ps, SGDOptions{});
  test::expect_error([&] { opt.add_param_group(ps, 0.1, 0); }, {"more than one parameter group"});
  test::expect_error([&] { opt.add_param_group({zeros({2}, DType::Int64)}, 0.1, 0); }, {"int64"});
  EXPECT_EQ(AdamOptions::adamw().weight_decay, 1e-2);
}

TEST(Optim, LoadStateDictValidates) {
  std::vector<Tensor> ps = {zeros({2, 3}).requires_grad_(), zeros({4}).requires_grad_()};
  Adam opt(ps, AdamOptions{});
  for (const Tensor& p : ps) p.set_grad(ones(p.shape()));
  opt.step();
  const StateDict good = opt.state_dict();
  EXPECT_EQ(good.at("state.0.1.exp_avg").shape(), (Shape{4}));
  auto with = [&](const std::string& key, const Tensor& t) {
    StateDict sd = good;
    sd[key] = t;
    return sd;
  };
  test::expect_error([&] { opt.load_state_dict(with("state.0.0.exp_avg", zeros({3, 2}))); }, {"state.0.0.exp_avg"});
  test::expect_error([&] { opt.load_state_dict(with("group.0.size", scalar_tensor(3, DType::Int64))); },
                     {"group.0.size"});
  test::expect_error([&] { opt.load_state_dict(with("state.0.2.exp_avg", zeros({4}))); }, {"state.0.2.exp_avg"});
  test::expect_error(
      [&] {
        opt.load_state_dict(with("state.0.0.momentum_buffer", zeros({2, 3})));
      },
      {"state.0.0.momentum_buffer"});
  test::expect_error([&] { opt.load_state_dict(with("master.0.0", zeros({2, 3}))); }, {"master.0.0"});
  StateDict missing = good;
  missing.erase("group.0.lr");
  test::expect_error([&] { opt.load_state_dict(missing); }, {"group.0.lr"});
  // A failed load changes nothing.
  EXPECT_TRUE(bit_equal(opt.param_groups()[0].slots[0].state.at("exp_avg"), good.at("state.0.0.exp_avg")));
  // bf16 parameters with master weights need the master in the dict.
  Tensor h = zeros({2}, DType::BFloat16).requires_grad_();
  SGD with_master({h}, SGDOptions{});
  with_master.set_master_weights(true);
  StateDict sd = with_master.state_dict();
  ASSERT_TRUE(sd.count("master.0.0"));
  sd.erase("master.0.0");
  test::expect_error([&] { with_master.load_state_dict(sd); }, {"master.0.0"});
}

}  // namespace
}  // namespace castor::optim

namespace castor::optim {
namespace {

// Plain SGD (momentum 0, no weight decay) whose update does not report its blocks: its 16-bit parameters get the
// whole write-back after the update instead of the fused one.
class UnfusedSgd : public Optimizer {
 public:
  UnfusedSgd(const std::vector<Tensor>& params, double lr) { add_param_group(params, lr, 0.0); }

 protected:
  BlockPass update(ParamGroup& group, ParamSlot&, Tensor& w, const Tensor& g) override {
    float* p = w.data<float>();
    const float* grad = g.data<float>();
    const float neg_lr = static_cast<float>(-group.lr);
    for (int64_t i = 0; i < w.numel(); ++i) p[i] = std::fma(grad[i], neg_lr, p[i]);
    return {};
  }
  std::vector<std::string> state_names() const override { return {}; }
};

// The master -> 16-bit copy written block by block inside SGD's update equals the whole pass after it, bit for
// bit, with nearest and with stochastic rounding (same keys per block), on a parameter big enough for threads.
TEST(OptimizerWriteBack, FusedPassEqualsTheWholeWriteBack) {
  for (Rounding rounding : {Rounding::Nearest, Rounding::Stochastic}) {
    Generator gen(3);
    const Tensor init = randn({300, 333}, DType::Float32, &gen).to(DType::BFloat16);
    const Tensor grad = randn({300, 333}, DType::Float32, &gen).to(DType::BFloat16);
    Tensor a = init.clone().requires_grad_(), b = init.clone().requires_grad_();
    SGD fused({a}, SGDOptions{.lr = 0.01});
    UnfusedSgd whole({b}, 0.01);
    for (Optimizer* o : {static_cast<Optimizer*>(&fused), static_cast<Optimizer*>(&whole)}) {
      o->set_master_weights(true);
      o->set_rounding(rounding, /*seed=*/7);
    }
    for (int step = 0; step < 3; ++step) {
      a.set_grad(grad.clone());
      b.set_grad(grad.clone());
      fused.step();
      whole.step();
    }
    EXPECT_TRUE(bit_equal(a, b));
    EXPECT_TRUE(bit_equal(fused.param_groups()[0].slots[0].master, whole.param_groups()[0].slots[0].master));
    if (rounding == Rounding::Nearest) {
      EXPECT_TRUE(bit_equal(a, fused.param_groups()[0].slots[0].master.to(DType::BFloat16)));
    }
  }
}

// The step's one multi-tensor pass over all parameters equals one pass per parameter (an optimizer each, as the
// per-tensor parallel loops before the fused pass were), bit for bit: SGD with momentum, AdamW and AdamW8bit over
// tensors large enough for threads, with short tails, a tiny one, and a bfloat16 one with a float32 master.
TEST(OptimizerPass, OnePassOverAllParametersEqualsOnePerParameter) {
  const std::vector<Shape> shapes = {{300, 333}, {5000}, {7}, {64, 130}, {3, 2049}};
  using Make = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>;
  const std::vector<std::pair<const char*, Make>> makes = {
      {"sgd",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<SGD>(p, SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-3});
       }},
      {"adamw", [](const std::vector<Tensor>& p) { return make_adamw(p, AdamOptions::adamw()); }},
      {"adamw8bit", [](const std::vector<Tensor>& p) {
         return std::make_unique<AdamW8bit>(p, AdamW8bitOptions{.block_size = 256});
       }}};
  for (const auto& [name, make] : makes) {
    SCOPED_TRACE(name);
    Generator gen(4);
    std::vector<Tensor> all, each;
    for (size_t j = 0; j < shapes.size(); ++j) {
      Tensor t = randn(shapes[j], DType::Float32, &gen);
      if (j == 3) t = t.to(DType::BFloat16);
      all.push_back(t.clone().requires_grad_());
      each.push_back(t.clone().requires_grad_());
    }
    std::unique_ptr<Optimizer> one = make(all);
    one->set_master_weights(true);
    std::vector<std::unique_ptr<Optimizer>> many;
    for (const Tensor& p : each) {
      many.push_back(make({p}));
      many.back()->set_master_weights(true);
    }
    for (int step = 0; step < 3; ++step) {
      for (size_t j = 0; j < shapes.size(); ++j) {
        const Tensor g = randn(shapes[j], DType::Float32, &gen).to(all[j].dtype());
        all[j].set_grad(g.clone());
        each[j].set_grad(g.clone());
      }
      one->step();
      for (auto& m : many) m->step();
    }
    for (size_t j = 0; j < shapes.size(); ++j) EXPECT_TRUE(bit_equal(all[j], each[j])) << j;
  }
}

}  // namespace
}  // namespace castor::optim
