// The loops of shared/notes/amp-reference.md written as literally as C++ allows (docs/amp.md shows each beside its
// Python original), each checked against the same loop in float32.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

using amp::OptLevel;

// A learnable synthetic task: each class brightens its own stripes of rows in its own channel.
struct Batch {
  Tensor input, target;
};
std::vector<Batch> data(int batches, int64_t n, int64_t c, int64_t hw, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  std::vector<Batch> out;
  for (int b = 0; b < batches; ++b) {
    const Tensor y = randint(0, classes, {n}, &gen);
    Tensor x = randn({n, c, hw, hw}, DType::Float32, &gen);
    float* px = x.data<float>();
    const int64_t* py = y.data<int64_t>();
    const int64_t stripes = (classes + c - 1) / c;  // class y: channel y % c, rows r with r % stripes == y / c
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = py[i] / c; r < hw; r += stripes)
        for (int64_t e = 0; e < hw; ++e) px[((i * c) + py[i] % c) * hw * hw + r * hw + e] += 1.0f;
    out.push_back({x, y});
  }
  return out;
}

std::shared_ptr<nn::Sequential> net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 8, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1),
      std::make_shared<nn::BatchNorm2d>(8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(8 * 6 * 6, 4)});
}

double accuracy(nn::Module& model, const std::vector<Batch>& batches) {
  NoGradGuard no_grad;
  model.eval();
  int64_t right = 0, total = 0;
  for (const auto& [input, target] : batches) {
    const Tensor pred = argmax(model(input).float_(), 1);
    for (double v : eq(pred, target).to_vector<double>()) right += v != 0;
    total += target.numel();
  }
  model.train();
  return static_cast<double>(right) / static_cast<double>(total);
}

// 1. autocast + GradScaler (torch.amp), float16 and bfloat16; the float32 twin runs the same loop disabled.
std::vector<double> torch_amp_loop(DType dtype, bool enabled) {
  auto model = net(/*seed=*/1);
  optim::SGD optimizer(model->parameters(), {.lr = 0.05});       // model, optimizer = Net(), SGD(...)
  amp::GradScaler scaler({.enabled = enabled, .dtype = dtype});  // scaler = GradScaler()
  std::vector<double> losses;
  for (auto& [input, target] : data(12, 16, 3, 6, 4, /*seed=*/7)) {  // for input, target in data:
    optimizer.zero_grad();                                           //   optimizer.zero_grad()
    Tensor loss;
    {
      amp::AutocastGuard autocast(dtype, enabled);  //   with autocast(device, dtype=float16):
      Tensor output = (*model)(input);              //       output = model(input)
      loss = F::cross_entropy(output, target);      //       loss = loss_fn(output, target)
      EXPECT_EQ(output.dtype(), enabled ? dtype : DType::Float32);
      EXPECT_EQ(loss.dtype(), DType::Float32);
    }
    scaler.scale(loss).backward();  //   scaler.scale(loss).backward()
    scaler.step(optimizer);         //   scaler.step(optimizer)
    scaler.update();                //   scaler.update()
    losses.push_back(loss.item());
    for (const Tensor& p : model->parameters()) EXPECT_EQ(p.grad().dtype(), DType::Float32);
  }
  return losses;
}

TEST(ReferenceLoops, TorchAmpAutocastAndGradScaler) {
  const std::vector<double> base = torch_amp_loop(DType::Float16, /*enabled=*/false);
  EXPECT_LT(base.back(), base.front() * 0.7);  // it learns
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<double> mixed = torch_amp_loop(dtype, /*enabled=*/true);
    ASSERT_EQ(mixed.size(), base.size());
    // Within the 16-bit type's rounding of the float32 run's losses (float16 11 bits, bfloat16 8).
    const double tol = dtype == DType::Float16 ? 0.01 : 0.05;
    for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(mixed[i], base[i], tol * (1 + base[i])) << i;
  }
}

// 2. Apex amp.initialize at each opt level, with the patched optimizer.step.
struct ApexResult {
  std::vector<double> losses;
  double accuracy;
};
ApexResult apex_loop(OptLevel level, DType dtype) {
  auto model = net(/*seed=*/1);
  optim::Adam optimizer(model->parameters(), {.lr = 3e-3});
  auto amp = amp::initialize(*model, {&optimizer}, level, dtype);  // model, optimizer = amp.initialize(...)
  const std::vector<Batch> batches = data(12, 16, 3, 6, 4, /*seed=*/7);
  ApexResult r;
  for (auto& [input, target] : batches) {  // for input, target in data:
    Tensor loss;
    {
      auto fw = amp->forward();                          // (O1's patched functions)
      loss = F::cross_entropy((*model)(input), target);  //   loss = loss_fn(model(input), target)
    }
    amp->scale_loss(loss, optimizer).backward();  //   with amp.scale_loss(loss, optimizer) as s: s.backward()
    optimizer.step();                             //   optimizer.step()
    optimizer.zero_grad();                        //   optimizer.zero_grad()
    r.losses.push_back(loss.item());
  }
  r.accuracy = accuracy(*model, batches);
  return r;
}

TEST(ReferenceLoops, ApexInitializeAtEachOptLevel) {
  const ApexResult base = apex_loop(OptLevel::O0, DType::Float16);
  EXPECT_LT(base.losses.back(), base.losses.front() * 0.7);
  for (DType dtype : {DType::Float16, DType::BFloat16})
    for (OptLevel level : {OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
      SCOPED_TRACE(std::string(amp::opt_level_name(level)) + " " + dtype_name(dtype));
      const ApexResult r = apex_loop(level, dtype);
      // O1/O2 follow the float32 run within the 16-bit rounding; O3 (pure 16-bit, "the speed baseline") within
      // a looser bound. Each learns as well as float32, give or take a batch's worth of samples.
      const double tol = (dtype == DType::Float16 ? 0.02 : 0.08) * (level == OptLevel::O3 ? 3 : 1);
      for (size_t i = 0; i < base.losses.size(); ++i)
        EXPECT_NEAR(r.losses[i], base.losses[i], tol * (1 + base.losses[i])) << i;
      EXPECT_GE(r.accuracy, base.accuracy - 0.1);
    }
}

// 3. The classic image-classification example: SimpleCNN (1x28x28, Fashion-MNIST's shape), Adam lr 1e-3, with
// O1 float16 against O0 (4 steps of batch 64 instead of 10 epochs, to keep the test short).
std::vector<double> classic_loop(OptLevel level) {  // as loop 2, on the classic model
  manual_seed(11);
  auto model = models::simple_cnn(1, 28, 28, 10);
  optim::Adam optimizer(model->parameters(), {.lr = 1e-3});
  auto amp = amp::initialize(*model, {&optimizer}, level, DType::Float16);
  std::vector<double> losses;
  for (auto& [input, target] : data(4, 64, 1, 28, 10, /*seed=*/9)) {
    Tensor loss;
    {
      auto fw = amp->forward();
      loss = F::cross_entropy((*model)(input), target);
    }
    amp->scale_loss(loss, optimizer).backward();
    optimizer.step();
    optimizer.zero_grad();
    losses.push_back(loss.item());
  }
  return losses;
}

TEST(ReferenceLoops, ClassicSimpleCnnExample) {
  const std::vector<double> base = classic_loop(OptLevel::O0);
  for (OptLevel level : {OptLevel::O1}) {
    SCOPED_TRACE(amp::opt_level_name(level));
    const std::vector<double> mixed = classic_loop(level);
    for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(mixed[i], base[i], 0.02 * (1 + base[i])) << i;
  }
}

}  // namespace
}  // namespace castor
