// Loss-scale arithmetic on raw gradient lists: the fused unscale-and-check pass and the scale update schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "castor/grad_scaler.h"
#include "castor/ops.h"
#include "test_util.h"

namespace castor {
namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(ScaleMath, InverseScaleIsTheFloat64ReciprocalRoundedToFloat32) {
  EXPECT_EQ(amp::inverse_scale(4.0f), 0.25f);
  EXPECT_EQ(amp::inverse_scale(3.0f), static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(amp::inverse_scale(65536.0f), 1.0f / 65536.0f);
}

TEST(ScaleMath, UnscaleContiguousTransposedStridedAndMixedDtypes) {
  // PyTorch's test_grad_scaling_unscale: inv_scale 0.25 turns 4 into 1 whatever the layout and dtype.
  Tensor contiguous = full({3, 4}, 4.0);
  Tensor transposed = full({4, 3}, 4.0).t();
  Tensor base = full({6, 4}, 4.0);
  Tensor strided = base.slice(/*dim=*/0, /*start=*/0, /*end=*/6, /*step=*/2);
  Tensor half = full({5}, 4.0, DType::Float16);
  Tensor bf16 = full({2, 3}, 4.0, DType::BFloat16).t();
  Tensor f64 = full({2}, 4.0, DType::Float64);
  EXPECT_FALSE(amp::non_finite_check_and_unscale_({contiguous, transposed, strided, half, bf16, f64}, 0.25f));
  for (const Tensor& t : {contiguous, transposed, strided, half, bf16, f64}) {
    SCOPED_TRACE(t.describe());
    EXPECT_TRUE(test::bit_equal(t, full(t.shape(), 1.0, t.dtype())));
  }
  // The rows between the strided view's rows are untouched.
  EXPECT_TRUE(test::bit_equal(base.slice(/*dim=*/0, /*start=*/1, /*end=*/6, /*step=*/2), full({3, 4}, 4.0)));
}

TEST(ScaleMath, UnscaleIntoFloat32IsOneRoundingOfTheProduct) {
  // A 16-bit gradient unscaled into a float32 buffer keeps bits the 16-bit type could not hold.
  Tensor g = tensor({65504, 3, -0.0009765625, 1e-7}, DType::Float16);
  Tensor out = empty({4}, DType::Float32);
  const float inv = amp::inverse_scale(65536.0f);
  EXPECT_FALSE(kernels::unscale(g, out, inv));
  auto want = g.to_vector<float>();
  for (float& v : want) v *= inv;
  EXPECT_EQ(out.to_vector<float>(), want);
  EXPECT_GT(out.to_vector<float>()[3], 0.0f);  // 1e-7 * 2^-16 underflows in float16, not in float32
  Tensor transposed = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3}, DType::BFloat16).t();
  Tensor out2 = empty({3, 2}, DType::Float32);
  EXPECT_FALSE(kernels::unscale(transposed, out2, 0.5f));
  EXPECT_EQ(out2.to_vector<float>(), (std::vector<float>{0.5, 2, 1, 2.5, 1.5, 3}));
}

TEST(ScaleMath, InfOrNaNAnywhereInAnyTensorIsFound) {
  for (double bad : {kInf, -kInf, kNaN}) {
    for (DType d : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64}) {
      for (int64_t pos : {0, 7, 4999}) {  // first, middle, last element (past one kernel block of 2048)
        Tensor clean = ones({3}, d);
        Tensor g = ones({5000}, d);
        g.narrow(/*dim=*/0, /*start=*/pos, /*length=*/1).fill_(bad);
        SCOPED_TRACE(std::string(dtype_name(d)) + " at " + std::to_string(pos) + " value " + std::to_string(bad));
        EXPECT_TRUE(amp::non_finite_check_and_unscale_({clean, g}, 0.5f));
      }
      Tensor strided = ones({4, 4}, d);
      strided.select(/*dim=*/0, /*index=*/3).select(/*dim=*/0, /*index=*/2).fill_(bad);
      EXPECT_TRUE(amp::non_finite_check_and_unscale_({strided.t()}, 0.5f));
    }
  }
  Tensor big = full({3}, 65504.0, DType::Float16);  // finite at the top of float16's range
  EXPECT_FALSE(amp::non_finite_check_and_unscale_({big}, 1.0f));
}

amp::GradScalerOptions torch_update_options() {
  amp::GradScalerOptions o;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.25;
  o.growth_interval = 2;
  return o;
}

TEST(ScaleMath, UpdateScaleGrowsAfterTheIntervalAndBacksOffOnInf) {
  // PyTorch's test_grad_scaling_update_scale.
  const amp::GradScalerOptions o = torch_update_options();
  amp::ScaleState s{4.0f, 0, 1};
  amp::update_scale(s, /*found_inf=*/false, o);
  EXPECT_EQ(s.scale, 4.0f);
  EXPECT_EQ(s.growth_tracker, 1);
  amp::update_scale(s, /*found_inf=*/false, o);
  EXPECT_EQ(s.scale, 8.0f);
  EXPECT_EQ(s.growth_tracker, 0);
  amp::update_scale(s, /*found_inf=*/true, o);
  EXPECT_EQ(s.scale, 2.0f);
  EXPECT_EQ(s.growth_tracker, 0);
}

TEST(ScaleMath, ScaleNeverBecomesInfNaNOrZero) {
  amp::GradScalerOptions o;
  o.growth_factor = 16.0;
  o.growth_interval = 1;
  amp::ScaleState s{1e38f, 0, 1};
  for (int i = 0; i < 10; ++i) {
    amp::update_scale(s, /*found_inf=*/false, o);
    EXPECT_TRUE(std::isfinite(s.scale));
    EXPECT_EQ(s.scale, 1e38f);  // 1e38 * 16 is not finite in float32: no growth (PyTorch's rule)
  }
  s.scale = 1e-36f;
  for (int i = 0; i < 200; ++i) amp::update_scale(s, /*found_inf=*/true, o);
  EXPECT_EQ(s.scale, std::numeric_limits<float>::min());  // the default floor, never 0
}

TEST(ScaleMath, MinAndMaxScaleBound) {
  amp::GradScalerOptions o;
  o.growth_interval = 1;
  o.min_scale = 1.0;
  o.max_scale = 16777216.0;  // Apex's 2^24
  amp::ScaleState s{8388608.0f, 0, 1};
  amp::update_scale(s, /*found_inf=*/false, o);
  EXPECT_EQ(s.scale, 16777216.0f);
  amp::update_scale(s, /*found_inf=*/false, o);
  EXPECT_EQ(s.scale, 16777216.0f);
  s.scale = 2.0f;
  amp::update_scale(s, /*found_inf=*/true, o);
  EXPECT_EQ(s.scale, 1.0f);
  amp::update_scale(s, /*found_inf=*/true, o);
  EXPECT_EQ(s.scale, 1.0f);
}

// Runs a schedule of overflow flags and returns the scale after each update.
std::vector<float> run_schedule(const amp::GradScalerOptions& o, const std::vector<bool>& overflows) {
  amp::ScaleState s{static_cast<float>(o.init_scale), 0, o.hysteresis};
  std::vector<float> scales;
  for (bool f : overflows) {
    amp::update_scale(s, f, o);
    scales.push_back(s.scale);
  }
  return scales;
}

TEST(ScaleMath, HysteresisSchedules) {
  // DeepSpeed's no_overflow / all_overflow / some_overflow with hysteresis 2, window 2, min scale 2^6.
  amp::GradScalerOptions o;
  o.init_scale = 256;
  o.growth_interval = 2;
  o.hysteresis = 2;
  o.min_scale = 64;
  EXPECT_EQ(run_schedule(o, {false, false, false, false}), (std::vector<float>{256, 512, 512, 1024}));
  // The first overflow is tolerated, each later one in a row backs off, down to the floor.
  EXPECT_EQ(run_schedule(o, {true, true, true, true, true}), (std::vector<float>{256, 128, 64, 64, 64}));
  // A clean step restores the allowance; growth restarts counting after every overflow.
  EXPECT_EQ(run_schedule(o, {true, false, true, true, false, false}),
            (std::vector<float>{256, 256, 256, 128, 128, 256}));
  o.hysteresis = 1;  // PyTorch: every overflow backs off
  EXPECT_EQ(run_schedule(o, {true, false, true, true, false, false}), (std::vector<float>{128, 128, 64, 64, 64, 128}));
}

TEST(ScaleMath, NonConsecutiveHysteresisAsDeepSpeed) {
  // DeepSpeed's DynamicLossScaler with consecutive_hysteresis=False (its default), worked by hand from its
  // update_scale: a clean step does not refill the hysteresis, only a growth of the scale does, so the
  // scattered overflows of iterations 0 and 2 add up and 2 already backs off.
  amp::GradScalerOptions o{
      .init_scale = 256, .growth_interval = 2, .hysteresis = 2, .consecutive_hysteresis = false, .min_scale = 64};
  EXPECT_EQ(run_schedule(o, {true, false, true, true, false, false}), (std::vector<float>{256, 256, 128, 64, 64, 128}));
  // A growth refills it: the overflow after the growth is tolerated again.
  EXPECT_EQ(run_schedule(o, {true, false, false, true, true}), (std::vector<float>{256, 256, 512, 512, 256}));
  o.consecutive_hysteresis = true;  // the same schedule when only overflows in a row count
  EXPECT_EQ(run_schedule(o, {true, false, true, true, false, false}),
            (std::vector<float>{256, 256, 256, 128, 128, 256}));
}

TEST(ScaleMath, RaiseAtMinScaleInsteadOfSkippingForever) {
  // DeepSpeed's raise_error_at_min_scale: an overflow that would back off a scale already at min_scale raises.
  amp::GradScalerOptions o{.init_scale = 256, .hysteresis = 2, .min_scale = 64, .raise_at_min_scale = true};
  amp::ScaleState s{256.0f, 0, 2};
  for (float want : {256.0f, 128.0f, 64.0f}) {  // hysteresis holds once, then 128, then the floor 64
    amp::update_scale(s, /*found_inf=*/true, o);
    EXPECT_EQ(s.scale, want);
  }
  test::expect_error([&] { amp::update_scale(s, /*found_inf=*/true, o); }, {"already at min_scale 64"});
  EXPECT_EQ(s.scale, 64.0f);
  amp::update_scale(s, /*found_inf=*/false, o);  // a clean step is fine
  o.raise_at_min_scale = false;
  amp::update_scale(s, /*found_inf=*/true, o);  // without the option the scale stays at the floor
  amp::update_scale(s, /*found_inf=*/true, o);
  EXPECT_EQ(s.scale, 64.0f);
  // Through GradScaler::update: the error reaches the training loop.
  amp::GradScaler scaler({.init_scale = 1.0, .enabled = true, .min_scale = 1.0, .raise_at_min_scale = true});
  Tensor w = full({2}, 1.0).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  w.set_grad(full({2}, kInf));
  scaler.step(opt);
  EXPECT_THROW(scaler.update(), Error);
}

TEST(ScaleMath, OptionsAreValidated) {
  auto bad = [](auto mutate) {
    amp::GradScalerOptions o;
    mutate(o);
    EXPECT_THROW(o.validate(), Error);
  };
  bad([](amp::GradScalerOptions& o) { o.init_scale = 0; });
  bad([](amp::GradScalerOptions& o) { o.init_scale = kInf; });
  bad([](amp::GradScalerOptions& o) { o.growth_factor = 1.0; });
  bad([](amp::GradScalerOptions& o) { o.backoff_factor = 1.0; });
  bad([](amp::GradScalerOptions& o) { o.growth_interval = 0; });
  bad([](amp::GradScalerOptions& o) { o.hysteresis = 0; });
  bad([](amp::GradScalerOptions& o) { o.min_scale = 0; });
  bad([](amp::GradScalerOptions& o) { o.max_scale = kInf; });
  EXPECT_NO_THROW(amp::GradScalerOptions{}.validate());
}

}  // namespace
}  // namespace castor
