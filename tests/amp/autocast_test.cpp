// Autocast: per-op output dtypes bit-identical to casting by hand, nesting, custom ops, the cast cache, explain.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/explain.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "runtime/dispatch.h"
#include "test_util.h"

namespace castor {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// The policy each op must follow, written from amp-reference.md independently of op_kind.h's table.
struct Case {
  const char* name;
  CastPolicy expected;
  Fn fn;
  std::vector<Shape> shapes;
};

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  const Shape m{3, 4};
  return {
      {"add", CastPolicy::Promote, [](V x) { return add(x[0], x[1]); }, {m, m}},
      {"sub", CastPolicy::Promote, [](V x) { return sub(x[0], x[1]); }, {m, m}},
      {"mul", CastPolicy::Promote, [](V x) { return mul(x[0], x[1]); }, {m, m}},
      {"div", CastPolicy::Promote, [](V x) { return div(x[0], x[1]); }, {m, m}},
      {"neg", CastPolicy::PassThrough, [](V x) { return neg(x[0]); }, {m}},
      {"pow", CastPolicy::Float32, [](V x) { return pow(x[0], /*exponent=*/3.0); }, {m}},
      {"exp", CastPolicy::Float32, [](V x) { return exp(x[0]); }, {m}},
      {"log", CastPolicy::Float32, [](V x) { return log(x[0]); }, {m}},
      {"sqrt", CastPolicy::PassThrough, [](V x) { return sqrt(x[0]); }, {m}},
      {"abs", CastPolicy::PassThrough, [](V x) { return abs(x[0]); }, {m}},
      {"relu", CastPolicy::PassThrough, [](V x) { return relu(x[0]); }, {m}},
      {"sigmoid", CastPolicy::PassThrough, [](V x) { return sigmoid(x[0]); }, {m}},
      {"tanh", CastPolicy::PassThrough, [](V x) { return tanh(x[0]); }, {m}},
      {"gelu", CastPolicy::PassThrough, [](V x) { return gelu(x[0]); }, {m}},
      {"clamp", CastPolicy::PassThrough, [](V x) { return clamp(x[0], /*min=*/0.7, /*max=*/1.5); }, {m}},
      {"where", CastPolicy::Promote, [](V x) { return where(gt(x[0], x[1]), x[0], x[1]); }, {m, m}},
      {"sum", CastPolicy::Float32, [](V x) { return sum(x[0], /*dims=*/{1}); }, {m}},
      {"mean", CastPolicy::Float32, [](V x) { return mean(x[0]); }, {m}},
      {"max", CastPolicy::PassThrough, [](V x) { return max(x[0], /*dim=*/1).first; }, {m}},
      {"min", CastPolicy::PassThrough, [](V x) { return min(x[0], /*dim=*/0).first; }, {m}},
      {"softmax", CastPolicy::Float32, [](V x) { return softmax(x[0], /*dim=*/1); }, {m}},
      {"log_softmax", CastPolicy::Float32, [](V x) { return log_softmax(x[0], /*dim=*/1); }, {m}},
      {"mm", CastPolicy::LowerPrecision, [](V x) { return mm(x[0], x[1]); }, {{3, 4}, {4, 5}}},
      {"matmul", CastPolicy::LowerPrecision, [](V x) { return matmul(x[0], x[1]); }, {{2, 3, 4}, {4, 5}}},
      {"bmm", CastPolicy::LowerPrecision, [](V x) { return bmm(x[0], x[1]); }, {{2, 3, 4}, {2, 4, 5}}},
      // clang-format off
      {"cat", CastPolicy::Promote, [](V x) { return cat({x[0], x[1]}, /*dim=*/0); }, {m, m}},
      {"stack", CastPolicy::Promote, [](V x) { return stack({x[0], x[1]}, /*dim=*/1); }, {m, m}},
      {"gather", CastPolicy::PassThrough,
       [](V x) { return gather(x[0], /*dim=*/1, tensor({0, 3, 1, 2, 2, 0}, Shape{3, 2}, DType::Int64)); }, {m}},
      // clang-format on
  };
}

// The inputs cast by hand for `policy` (what autocast must do), to run with autocast off.
std::vector<Tensor> by_hand(CastPolicy policy, const std::vector<Tensor>& in, DType lower) {
  std::vector<Tensor> out = in;
  DType widest = in[0].dtype();
  for (const Tensor& t : in) widest = promote_types(widest, t.dtype());
  for (Tensor& t : out) {
    if (t.dtype() != DType::Float32 && !is_16bit_float(t.dtype())) continue;
    if (policy == CastPolicy::LowerPrecision) t = t.to(lower);
    if (policy == CastPolicy::Float32) t = t.float_();
    if (policy == CastPolicy::Promote) t = t.to(widest);
  }
  return out;
}

TEST(Autocast, EveryOpHasItsPolicyDtypeAndMatchesCastingByHand) {
  Generator gen(11);
  for (DType lower : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases()) {
      // Three input mixes: all float32, the first input 16-bit, all 16-bit.
      for (int mix = 0; mix < 3; ++mix) {
        std::vector<Tensor> in;
        for (size_t i = 0; i < c.shapes.size(); ++i) {
          Tensor t = uniform(c.shapes[i], /*low=*/0.5, /*high=*/2.0, DType::Float32, &gen);
          const bool low = mix == 2 || (mix == 1 && i == 0);
          in.push_back(low ? t.to(lower) : t);
        }
        SCOPED_TRACE(std::string(c.name) + " in " + dtype_name(lower) + ", mix " + std::to_string(mix));
        const std::vector<Tensor> hand = by_hand(c.expected, in, lower);
        DType want = hand[0].dtype();
        if (c.expected == CastPolicy::LowerPrecision) want = lower;
        if (c.expected == CastPolicy::Float32) want = DType::Float32;
        Tensor got = amp::autocast(lower, [&] { return c.fn(in); });
        Tensor expect = c.fn(hand);
        EXPECT_EQ(got.dtype(), want);
        EXPECT_TRUE(test::bit_equal(got, expect));
      }
    }
  }
}

TEST(Autocast, Float64AndIntegersAreNeverCast) {
  Generator gen(12);
  for (const Case& c : cases()) {
    std::vector<Tensor> in;
    for (const Shape& s : c.shapes) in.push_back(uniform(s, /*low=*/0.5, /*high=*/2.0, DType::Float64, &gen));
    SCOPED_TRACE(c.name);
    Tensor got = amp::autocast(DType::BFloat16, [&] { return c.fn(in); });
    EXPECT_EQ(got.dtype(), DType::Float64);
    EXPECT_TRUE(test::bit_equal(got, c.fn(in)));
  }
  Tensor a = tensor({1, 2, 3}, DType::Int64), b = tensor({4, 5, 6}, DType::Int64);
  Tensor s = amp::autocast(DType::Float16, [&] { return sum(a * b); });
  EXPECT_EQ(s.dtype(), DType::Int64);
  EXPECT_EQ(s.item(), 32);
}

TEST(Autocast, NestedDisabledRegionTurnsCastingOffAndRestores) {
  Tensor a = ones({2, 2}), b = ones({2, 2});
  {
    amp::AutocastGuard outer(DType::Float16);
    Tensor low = mm(a, b);
    EXPECT_EQ(low.dtype(), DType::Float16);
    {
      amp::AutocastGuard inner(DType::Float16, /*enabled=*/false);
      EXPECT_FALSE(amp::is_autocast_enabled());
      EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
      EXPECT_EQ(mm(low.float_(), b).dtype(), DType::Float32);  // earlier 16-bit results are cast back by hand
      EXPECT_THROW(mm(low, b), Error);                         // ... and not silently
    }
    EXPECT_TRUE(amp::is_autocast_enabled());
    EXPECT_EQ(amp::autocast_state().dtype, DType::Float16);
    EXPECT_EQ(mm(a, b).dtype(), DType::Float16);
  }
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
}

TEST(Autocast, BatchNormKeepsTheInputDtypeAsTorch) {
  // PyTorch 1.13's CPU autocast leaves batch_norm out of its lists: a bfloat16 input gives a bfloat16 output
  // (statistics in float32), in training and in eval mode. Compared element by element with the oracle's.
  const test::ScratchDir dir;
  const std::string out = dir + "/batch_norm_autocast.txt";
  ASSERT_TRUE(test::run_oracle("amp_oracle.py", {"batch_norm", out}));
  std::vector<float> v(96);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * static_cast<float>(i)) * 3.0f + 0.5f;
  const Tensor x = from_blob(v.data(), {2, 3, 4, 4}, DType::Float32).to(DType::BFloat16);
  std::ifstream in(out);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    std::string line, dtype;
    ASSERT_TRUE(std::getline(in, line));
    std::istringstream fields(line);
    fields >> dtype;
    std::vector<double> want;
    for (double d; fields >> d;) want.push_back(d);
    amp::AutocastGuard autocast(DType::BFloat16);
    const Tensor y = F::batch_norm(x, zeros({3}), ones({3}), full({3}, 1.5), full({3}, -0.25), training);
    EXPECT_EQ(dtype_name(y.dtype()), dtype);
    EXPECT_TRUE(test::close(y.to(DType::Float64), tensor(want, {2, 3, 4, 4}, DType::Float64), 1e-2, 1e-3));
  }
}

TEST(Autocast, BannedOpRaisesNamingTheSafeAlternative) {
  amp::AutocastGuard guard(DType::Float16);
  Tensor p = full({4}, 0.5), t = ones({4});
  test::expect_error(
      [&] {
        amp::apply_autocast(OpKind::BinaryCrossEntropy, {p, t});
      },
      {"binary_cross_entropy_with_logits"});
}

TEST(Autocast, CustomOpsBehaveLikeBuiltIns) {
  amp::CustomOp gemm = amp::register_op("test_gemm", CastPolicy::LowerPrecision);
  amp::CustomOp stable = amp::register_op("test_stable_gemm", CastPolicy::Float32);
  amp::CustomOp unsafe = amp::register_op("test_unsafe", CastPolicy::Banned, "test_safe_op");
  EXPECT_EQ(amp::register_op("test_gemm", CastPolicy::LowerPrecision).name(), "test_gemm");
  EXPECT_THROW(amp::register_op("test_gemm", CastPolicy::Float32), Error);
  EXPECT_THROW(amp::register_op("mm", CastPolicy::Float32), Error);

  Generator gen(3);
  Tensor a = randn({3, 4}, DType::Float32, &gen), b = randn({4, 5}, DType::Float32, &gen);
  Fn run_mm = [](const std::vector<Tensor>& x) { return mm(x[0], x[1]); };
  amp::AutocastGuard guard(DType::BFloat16);
  Tensor custom = gemm({a, b}, run_mm);
  EXPECT_EQ(custom.dtype(), DType::BFloat16);
  EXPECT_TRUE(test::bit_equal(custom, mm(a, b)));
  // A float32 op gets 16-bit inputs widened, and its inner ops stay float32 (autocast is off inside).
  Tensor wide = stable({a.bfloat16(), b}, run_mm);
  EXPECT_EQ(wide.dtype(), DType::Float32);
  {
    amp::AutocastGuard off(DType::BFloat16, /*enabled=*/false);
    EXPECT_TRUE(test::bit_equal(wide, mm(a.bfloat16().float_(), b)));
  }
  test::expect_error([&] { unsafe({a}, run_mm); }, {"test_safe_op"});
}

TEST(Autocast, WeightIsCastOnceAcrossForwardAndBackward) {
  Generator gen(5);
  Tensor w = randn({4, 4}, DType::Float32, &gen).requires_grad_();
  Tensor x = randn({2, 4}, DType::Float32, &gen);
  const amp::CastCacheStats before = amp::cast_cache_stats();
  {
    amp::AutocastGuard guard(DType::BFloat16);
    Tensor y = mm(mm(x, w), w);  // two uses of w in one forward
    sum(y.float_()).backward();  // backward inside the region casts nothing again
    const amp::CastCacheStats s = amp::cast_cache_stats();
    EXPECT_EQ(s.misses - before.misses, 1);
    EXPECT_EQ(s.hits - before.hits, 1);
    EXPECT_EQ(s.entries, 1);
  }
  EXPECT_EQ(amp::cast_cache_stats().entries, 0);  // cleared when the outermost region exits
  EXPECT_EQ(w.grad().dtype(), DType::Float32);

  // Caching off: every use casts, nothing is kept.
  const amp::CastCacheStats off_before = amp::cast_cache_stats();
  {
    amp::AutocastGuard guard(DType::BFloat16, /*enabled=*/true, /*cache_enabled=*/false);
    amp::ExplainGuard explain;
    mm(mm(x, w), w);
    EXPECT_EQ(amp::cast_cache_stats().entries, 0);
    EXPECT_EQ(amp::cast_cache_stats().misses, off_before.misses);
    EXPECT_EQ(explain.summary().casts, 3);  // x once, w twice
    EXPECT_EQ(explain.summary().cache_hits, 0);
  }
}

// An optimizer step after an autocast forward rounds the updated float32 weight to 16 bits in its own pass and the
// next forward takes that copy instead of casting: the bits of casting the weight (oracle: w.to(bfloat16) with
// autocast off), never written while an earlier forward's graph holds it, and not taken once the weight changed.
TEST(Autocast, OptimizerStepKeepsTheNextForwardsCast) {
  Generator gen(7);
  Tensor w = randn({8, 8}, DType::Float32, &gen).requires_grad_();
  const Tensor x = randn({3, 8}, DType::Float32, &gen);
  optim::Adam opt({w}, optim::AdamOptions::adamw());
  auto forward = [&] {
    amp::AutocastGuard guard(DType::BFloat16);
    return mm(mm(x, w), w);  // w's cast is saved for backward, and its gradient depends on it
  };
  auto by_hand = [&] { return mm(mm(x.bfloat16(), w.detach().bfloat16()), w.detach().bfloat16()); };
  auto step = [&](const Tensor& y, bool retain) {
    opt.zero_grad();
    sum(y.float_()).backward({}, /*retain_graph=*/retain);
    opt.step();
  };
  amp::CastCacheStats s0 = amp::cast_cache_stats();
  step(forward(), false);  // cast by autocast, then kept by the step
  EXPECT_EQ(amp::cast_cache_stats().misses - s0.misses, 1);
  EXPECT_EQ(amp::cast_cache_stats().kept - s0.kept, 0);

  s0 = amp::cast_cache_stats();
  const Tensor y2 = forward();
  EXPECT_EQ(amp::cast_cache_stats().misses - s0.misses, 0);
  EXPECT_EQ(amp::cast_cache_stats().kept - s0.kept, 1);
  EXPECT_TRUE(test::bit_equal(y2, by_hand()));
  // y2's graph (its saved cast) outlives the next step: the step keeps its copy in another buffer.
  step(y2, /*retain=*/true);
  const Tensor grad_before = w.grad().clone();
  opt.zero_grad();
  sum(y2.float_()).backward();
  EXPECT_TRUE(test::bit_equal(w.grad(), grad_before));
  s0 = amp::cast_cache_stats();
  EXPECT_TRUE(test::bit_equal(forward(), by_hand()));
  EXPECT_EQ(amp::cast_cache_stats().kept - s0.kept, 1);

  // The weight changed after the step: cast again.
  step(forward(), false);
  {
    NoGradGuard no_grad;
    w.mul_(0.5);
  }
  s0 = amp::cast_cache_stats();
  EXPECT_TRUE(test::bit_equal(forward(), by_hand()));
  EXPECT_EQ(amp::cast_cache_stats().misses - s0.misses, 1);
  EXPECT_EQ(amp::cast_cache_stats().kept - s0.kept, 0);
}

TEST(Autocast, CacheDoesNotGrowUnderNoGradAndRefreshesAfterTheWeightChanges) {
  Generator gen(6);
  Tensor w = randn({4, 4}, DType::Float32, &gen).requires_grad_();
  Tensor x = randn({2, 4}, DType::Float32, &gen);
  amp::AutocastGuard guard(DType::Float16);
  {
    NoGradGuard no_grad;
    for (int i = 0; i < 5; ++i) mm(x, w);
    EXPECT_EQ(amp::cast_cache_stats().entries, 0);
  }
  Tensor first = mm(x, w);
  {
    NoGradGuard no_grad;
    w.mul_(2.0);  // an optimizer step changes the weight in place
  }
  Tensor second = mm(x, w);
  amp::AutocastGuard off(DType::Float16, /*enabled=*/false);
  EXPECT_TRUE(test::bit_equal(second, mm(x.half(), w.half())));
  EXPECT_FALSE(test::bit_equal(second, first));
}

TEST(Autocast, ExplainReportsEachOpsDtypesAndReasons) {
  Generator gen(8);
  Tensor w1 = randn({4, 8}, DType::Float32, &gen).requires_grad_();
  Tensor w2 = randn({8, 3}, DType::Float32, &gen).requires_grad_();
  Tensor x = randn({2, 4}, DType::Float32, &gen);
  amp::ExplainGuard explain;  // scoped to the forward pass: backward is not part of the report
  {
    amp::AutocastGuard guard(DType::BFloat16);
    Tensor h = relu(mm(x, w1));
    sum(log_softmax(mm(h, w2), /*dim=*/1));
  }
  const auto& rows = explain.rows();
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].op, "mm");
  EXPECT_EQ(rows[0].given, (std::vector<DType>{DType::Float32, DType::Float32}));
  EXPECT_EQ(rows[0].ran, (std::vector<DType>{DType::BFloat16, DType::BFloat16}));
  EXPECT_EQ(rows[0].out, DType::BFloat16);
  EXPECT_EQ(rows[0].why,
            "float32 input 0 cast to bfloat16 (lower_precision); "
            "float32 weight cast to bfloat16 (lower_precision; cached)");
  EXPECT_EQ(rows[1].op, "relu");
  EXPECT_EQ(rows[1].why, "runs in its input dtype (pass_through)");
  EXPECT_EQ(rows[2].why, "float32 weight cast to bfloat16 (lower_precision; cached)");
  EXPECT_EQ(rows[3].op, "log_softmax");
  EXPECT_EQ(rows[3].why, "bfloat16 input 0 cast to float32 (fp32)");
  EXPECT_EQ(rows[4].op, "sum");
  EXPECT_EQ(rows[4].why, "inputs already float32 (fp32)");
  const amp::ExplainSummary s = explain.summary();
  EXPECT_EQ(s.ops, 5);
  EXPECT_EQ(s.ops_16bit, 3);
  EXPECT_EQ(s.ops_float32, 2);
  const std::string table = explain.table();
  EXPECT_NE(table.find("(float32, float32) as (bfloat16, bfloat16) -> bfloat16"), std::string::npos) << table;
  EXPECT_NE(table.find("5 ops: 3 in 16-bit, 2 in float32"), std::string::npos) << table;
}

TEST(Autocast, ExplainSeesCustomOpsAndCacheHits) {
  amp::CustomOp gemm = amp::register_op("test_explained_gemm", CastPolicy::LowerPrecision);
  Tensor w = ones({2, 2}).requires_grad_();
  Tensor x = ones({1, 2});
  amp::ExplainGuard explain;
  amp::AutocastGuard guard(DType::Float16);
  mm(x, w);
  gemm({x, w}, [](const std::vector<Tensor>& in) { return mm(in[0], in[1]); });
  const auto& rows = explain.rows();
  ASSERT_EQ(rows.size(), 3u);  // mm, the inner mm of the custom op, the custom op
  EXPECT_EQ(rows[2].op, "test_explained_gemm");
  EXPECT_EQ(rows[2].out, DType::Float16);
  EXPECT_NE(rows[2].why.find("float32 weight cast to float16 (lower_precision; from cache)"), std::string::npos)
      << rows[2].why;
  EXPECT_EQ(explain.summary().cache_hits, 1);
}

TEST(Autocast, ObserversSeeTheTimeSpentCastingInputs) {
  struct Recorder : OpObserver {
    std::vector<std::pair<OpKind, double>> seen;
    void on_op(const OpEvent& e) override {
      if (!e.backward) seen.emplace_back(e.op, e.autocast_seconds);
    }
  } rec;
  Generator gen(3);
  const Tensor a = randn({256, 256}, DType::Float32, &gen), b = randn({256, 256}, DType::Float32, &gen);
  set_op_observer(&rec);
  mm(a, b);  // autocast off: no casting time
  {
    amp::AutocastGuard guard(DType::BFloat16);
    mm(a, b);  // both inputs cast to bfloat16 first
  }
  set_op_observer(nullptr);
  ASSERT_EQ(rec.seen.size(), 2u);
  EXPECT_EQ(rec.seen[0], std::make_pair(OpKind::Mm, 0.0));
  EXPECT_EQ(rec.seen[1].first, OpKind::Mm);
  EXPECT_GT(rec.seen[1].second, 0.0);
}

}  // namespace
}  // namespace castor
