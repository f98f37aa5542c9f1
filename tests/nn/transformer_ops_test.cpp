// The transformer ops (embedding, layer/RMS norm, fused attention, fused cross-entropy) against PyTorch
// (tests/oracle/transformer_oracle.py) forward and backward in float32, float16 and bfloat16, and against float64
// finite differences.
//
// Tolerances (docs/transformers.md): float32 within 1e-5 relative (sums in another order); 16-bit results are one
// rounding of the float32 result, so within one unit of the 16-bit type's precision (2^-7 bf16, 2^-10 fp16) of the
// oracle's, except attention: its probabilities are rounded to the 16-bit type before the product with v (as flash
// attention does), so it is held to four units.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/allocator.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "ops/transformer.h"
#include "test_util.h"

namespace castor {
namespace {

using Inputs = std::vector<Tensor>;
using Op = std::function<Tensor(const Inputs&)>;

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> table = {
      {"layer_norm", [](const Inputs& x) { return F::layer_norm(x[0], {24}, x[1], x[2]); }},
      {"layer_norm_plain",
       [](const Inputs& x) {
         return F::layer_norm(x[0], {4, 6});
       }},
      {"rms_norm", [](const Inputs& x) { return F::rms_norm(x[0], {40}, x[1]); }},
      {"embedding", [](const Inputs& x) { return F::embedding(x[0], x[1], /*padding_idx=*/2); }},
      {"attention_causal",
       [](const Inputs& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); }},
      {"attention_mask", [](const Inputs& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }},
      {"attention_qkv", [](const Inputs& x) { return F::qkv_attention(x[0], /*n_head=*/3); }},
      // Grouped-query attention: 6 query heads on 2 k/v heads; 4 on 1 (multi-query) with a mask.
      {"attention_gqa",
       [](const Inputs& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); }},
      {"attention_mqa_mask", [](const Inputs& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }},
      {"cross_entropy",
       [](const Inputs& x) { return F::cross_entropy(x[0], x[1], F::Reduction::None, 0.0, /*ignore_index=*/-100); }},
      {"cross_entropy_smooth",
       [](const Inputs& x) { return F::cross_entropy(x[0], x[1], F::Reduction::Sum, /*label_smoothing=*/0.1); }},
  };
  return table;
}

double unit(DType d) { return d == DType::BFloat16 ? 0x1p-7 : d == DType::Float16 ? 0x1p-10 : 1e-5; }

::testing::AssertionResult near(const Tensor& got, const Tensor& want, double units) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << got.describe() << " vs " << want.describe();
  double scale = 0;
  for (double v : want.to_vector<double>()) scale = std::max(scale, std::abs(v));
  const double eps = units * unit(got.dtype());
  return test::close(got, want, eps, eps * scale);
}

TEST(TransformerOps, MatchPyTorch) {
  const test::ScratchDir dir;
  const std::string file = dir + "/transformer_oracle.safetensors";
  ASSERT_TRUE(test::run_oracle("transformer_oracle.py", {file}));
  const LoadedTensors oracle = load_safetensors(file);
  std::istringstream cases(oracle.metadata.at("cases"));
  std::string entry;
  int run = 0;
  while (std::getline(cases, entry, ';')) {
    std::istringstream is(entry);
    std::string name, op, dtype;
    is >> name >> op >> dtype;
    SCOPED_TRACE(name);
    ++run;
    Inputs in;
    for (int i = 0; oracle.tensors.count(name + ".in" + std::to_string(i)); ++i) {
      Tensor t = oracle.tensors.at(name + ".in" + std::to_string(i)).clone();
      if (is_floating(t.dtype())) t.requires_grad_();
      in.push_back(t);
    }
    const double units = op.rfind("attention", 0) == 0 ? 4 : 1;
    const Tensor out = ops().at(op)(in);
    EXPECT_TRUE(near(out, oracle.tensors.at(name + ".out"), units)) << "forward";
    out.backward(oracle.tensors.at(name + ".gout"));
    int g = 0;
    for (const Tensor& t : in) {
      if (!is_floating(t.dtype())) continue;
      EXPECT_TRUE(near(t.grad(), oracle.tensors.at(name + ".grad" + std::to_string(g)), units)) << "grad " << g;
      ++g;
    }
  }
  EXPECT_EQ(run, 3 * static_cast<int>(ops().size()));
}

Tensor rnd(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, DType::Float64, &gen).requires_grad_();
}

TEST(TransformerOps, Float64MatchesFiniteDifferences) {
  using V = const Inputs&;
  EXPECT_TRUE(test::gradcheck([](V x) { return F::layer_norm(x[0], {5}, x[1], x[2]); },
                              {rnd({3, 5}, 1), rnd({5}, 2), rnd({5}, 3)}));
  EXPECT_TRUE(test::gradcheck([](V x) { return F::layer_norm(x[0], {2, 3}); }, {rnd({4, 2, 3}, 4)}));
  EXPECT_TRUE(test::gradcheck([](V x) { return F::rms_norm(x[0], {6}, x[1]); }, {rnd({3, 6}, 5), rnd({6}, 6)}));
  const Tensor idx = tensor({1, 0, 3, 1, 2, 3}, Shape{2, 3}, DType::Int64);
  EXPECT_TRUE(test::gradcheck([&](V x) { return F::embedding(idx, x[0]); }, {rnd({4, 5}, 7)}));
  // padding_idx's row takes no gradient (PyTorch's definition, not the derivative).
  const Tensor w = rnd({4, 5}, 7);
  sum(F::embedding(idx, w, /*padding_idx=*/3)).backward();
  EXPECT_EQ(w.grad().narrow(0, 3, 1).to_vector<double>(), std::vector<double>(5, 0.0));
  EXPECT_EQ(w.grad().narrow(0, 1, 1).to_vector<double>(), std::vector<double>(5, 2.0));
  EXPECT_TRUE(test::gradcheck(
      [](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); },
      {rnd({1, 2, 5, 4}, 8), rnd({1, 2, 5, 4}, 9), rnd({1, 2, 5, 4}, 10)}));
  const Tensor mask = tensor({1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1}, Shape{3, 4}, DType::Bool);
  EXPECT_TRUE(test::gradcheck([&](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], mask); },
                              {rnd({2, 1, 3, 4}, 11), rnd({2, 1, 4, 4}, 12), rnd({2, 1, 4, 4}, 13)}));
  EXPECT_TRUE(test::gradcheck([](V x) { return F::qkv_attention(x[0], /*n_head=*/2); }, {rnd({2, 5, 3 * 6}, 17)}));
  // Grouped-query attention: dk, dv summed over the query heads sharing each k/v head.
  EXPECT_TRUE(test::gradcheck(
      [](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); },
      {rnd({2, 4, 5, 3}, 18), rnd({2, 2, 5, 3}, 19), rnd({2, 2, 5, 3}, 20)}));
  EXPECT_TRUE(test::gradcheck([&](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], mask); },
                              {rnd({2, 3, 3, 4}, 21), rnd({2, 1, 4, 4}, 22), rnd({2, 1, 4, 4}, 23)}));
  const Tensor target = tensor({2, 0, -100, 4}, DType::Int64);
  EXPECT_TRUE(test::gradcheck(
      [&](V x) { return F::cross_entropy(x[0], target, F::Reduction::Mean, 0.0, /*ignore_index=*/-100); },
      {rnd({4, 5}, 14)}));
  EXPECT_TRUE(test::gradcheck([](V x) { return silu(x[0]); }, {rnd({3, 4}, 15)}));
  EXPECT_TRUE(
      test::gradcheck([](V x) { return masked_fill(x[0], gt(x[0].detach(), zeros({})), 1.0); }, {rnd({3, 4}, 16)}));
}

// A weight used by the embedding and by a later op (GPT's tied wte = lm_head): the later op's gradient reaches .grad
// first and the embedding adds its indexed rows into it in place. Hand-worked oracle: each row's float32 sum in the
// order of the positions, then one float32 addition; rows no index reaches (and padding_idx) keep the other
// gradient. The same bits through the dense path (a hook on the weight, castor::grad) and across two backwards.
TEST(TransformerOps, EmbeddingAddsItsRowsIntoAnExistingGradient) {
  const int64_t V = 7, C = 5, pad = 0;
  const std::vector<int64_t> ids = {3, 1, 3, 0, 6, 3, 1};
  const int64_t N = static_cast<int64_t>(ids.size());
  const Tensor idx = tensor(std::vector<double>(ids.begin(), ids.end()), Shape{N}, DType::Int64);
  const Tensor a = randn({V, C}), d = randn({N, C});
  const std::vector<float> av = a.to_vector<float>(), dv = d.to_vector<float>();
  // The gradient after one more backward from `before`: (before + a) + the row's sum (just a + sum the first time).
  auto expected = [&](const std::vector<float>* before) {
    std::vector<float> want(V * C);
    for (int64_t r = 0; r < V; ++r)
      for (int64_t j = 0; j < C; ++j) {
        float acc = 0;
        for (int64_t n = 0; n < N; ++n)
          if (ids[n] == r && r != pad) acc += dv[n * C + j];
        const float first = before ? (*before)[r * C + j] + av[r * C + j] : av[r * C + j];
        want[r * C + j] = first + acc;
      }
    return want;
  };
  // loss = sum(embedding(idx, w) * d) + sum(w * a); the product is recorded last, so its gradient a comes first.
  auto loss_of = [&](const Tensor& w) {
    const Tensor rows = sum(mul(F::embedding(idx, w, pad), d));
    return rows + sum(mul(w, a));
  };
  auto expect_bits = [&](const Tensor& g, const std::vector<float>& want) {
    ASSERT_TRUE(g.defined());
    const std::vector<float> got = g.to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
  };
  const Tensor w = randn({V, C}).requires_grad_();
  const std::vector<float> once = expected(nullptr);
  loss_of(w).backward();
  expect_bits(w.grad(), once);
  // A second backward adds both uses once more, in the same order.
  loss_of(w).backward();
  expect_bits(w.grad(), expected(&once));
  // With a hook on the weight every gradient goes through it whole: the dense path, the same bits.
  const Tensor h = randn({V, C}).requires_grad_();
  int hook_calls = 0;
  h.register_hook([&](const Tensor& g) {
    ++hook_calls;
    return g;
  });
  loss_of(h).backward();
  EXPECT_EQ(hook_calls, 2);
  expect_bits(h.grad(), once);
  const Tensor u = randn({V, C}).requires_grad_();
  expect_bits(grad({loss_of(u)}, {u})[0], once);
}

// The attention's saved state and scratch grow linearly in T: one layer's forward + backward at T = 1024 peaks
// under 5x its peak at T = 256 (a (T, T) probability matrix per head would make it 16x), with 4 k/v heads and with
// 2 shared by the 4 query heads (grouped-query attention); the shared heads' peak is no larger (no repeated copies).
TEST(TransformerOps, AttentionMemoryIsLinearInT) {
  auto peak = [](int64_t t, int64_t kv_heads) {
    Generator gen(1);
    const Tensor q = randn({1, 4, t, 64}, DType::BFloat16, &gen).requires_grad_();
    const Tensor k = randn({1, kv_heads, t, 64}, DType::BFloat16, &gen).requires_grad_();
    const Tensor v = randn({1, kv_heads, t, 64}, DType::BFloat16, &gen).requires_grad_();
    reset_peak_memory_stats();
    const int64_t base = memory_stats().current_bytes;
    Tensor y = F::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    sum(y.float_()).backward();
    return memory_stats().peak_bytes - base;
  };
  for (int64_t kv_heads : {4, 2}) {
    const int64_t small = peak(256, kv_heads), large = peak(1024, kv_heads);
    EXPECT_LT(large, 5 * small) << kv_heads << " k/v heads: " << small << " bytes at T=256, " << large << " at T=1024";
  }
  EXPECT_LE(peak(1024, 2), peak(1024, 4));
}

// With dropout (PyTorch's math path, each k/v head repeated for its query heads) grouped-query attention is the
// attention of the repeated heads: the same mask drawn from the same seed, the same result and gradients.
TEST(TransformerOps, GroupedQueryAttentionWithDropoutIsTheRepeatedHeads) {
  Generator gen(3);
  const Tensor q = randn({2, 4, 6, 8}, DType::Float32, &gen).requires_grad_();
  const Tensor k = randn({2, 2, 6, 8}, DType::Float32, &gen).requires_grad_();
  const Tensor v = randn({2, 2, 6, 8}, DType::Float32, &gen).requires_grad_();
  manual_seed(11);
  const Tensor y = F::scaled_dot_product_attention(q, k, v, {}, 0.25, /*is_causal=*/true);
  sum(y * y).backward();
  const Tensor q2 = q.detach().clone().requires_grad_(), k2 = k.detach().clone().requires_grad_(),
               v2 = v.detach().clone().requires_grad_();
  auto repeated = [](const Tensor& x) { return stack({x, x}, 2).reshape({2, 4, 6, 8}); };  // head h -> h / 2
  manual_seed(11);
  const Tensor y2 = F::scaled_dot_product_attention(q2, repeated(k2), repeated(v2), {}, 0.25, /*is_causal=*/true);
  sum(y2 * y2).backward();
  EXPECT_TRUE(test::close(y, y2, 1e-6, 1e-6));
  EXPECT_TRUE(test::close(q.grad(), q2.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(test::close(k.grad(), k2.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(test::close(v.grad(), v2.grad(), 1e-6, 1e-6));
}

// The rotary tables are made once per (head size, theta) and shared: a shorter request is a view of the same rows,
// a longer one grows them without changing a row already handed out; another theta or head size has its own.
TEST(TransformerOps, RotaryTablesAreMadeOnceAndShared) {
  const auto [cos8, sin8] = rotary_tables(8, 16, 321.0);
  const auto [cos4, sin4] = rotary_tables(4, 16, 321.0);
  EXPECT_EQ(cos8.shape(), (Shape{8, 8}));
  EXPECT_EQ(cos4.data_ptr(), cos8.data_ptr());
  EXPECT_EQ(sin4.data_ptr(), sin8.data_ptr());
  const auto [cos100, sin100] = rotary_tables(100, 16, 321.0);
  EXPECT_EQ(cos100.size(0), 100);
  EXPECT_TRUE(test::bit_equal(cos100.narrow(0, 0, 8), cos8));
  EXPECT_TRUE(test::bit_equal(sin100.narrow(0, 0, 8), sin8));
  EXPECT_EQ(rotary_tables(50, 16, 321.0).first.data_ptr(), cos100.data_ptr());
  EXPECT_NE(rotary_tables(8, 16, 322.0).first.data_ptr(), cos100.data_ptr());
  // Position 0 is no rotation; position 1's first pair turns by 1 radian (theta^0), in float32.
  EXPECT_EQ(cos8.narrow(0, 0, 1).to_vector<double>(), std::vector<double>(8, 1.0));
  EXPECT_EQ(sin8.select(0, 1).select(0, 0).item(), static_cast<double>(static_cast<float>(std::sin(1.0))));
  // Applied to 16-bit q, k in their dtype.
  EXPECT_EQ(F::rotary_embedding(randn({1, 3, 2, 16}).to(DType::BFloat16)).dtype(), DType::BFloat16);
}

TEST(TransformerOps, ErrorsNameTheOpAndTheProblem) {
  const Tensor x = randn({2, 3, 4, 8});
  EXPECT_THROW(F::scaled_dot_product_attention(x, x, randn({2, 3, 5, 8})), Error);
  test::expect_error(
      [&] {
        F::scaled_dot_product_attention(x, randn({2, 2, 4, 8}), randn({2, 2, 4, 8}));
      },
      {"scaled_dot_product_attention", "q's 3 heads are not a multiple of k and v's 2 heads"});
  EXPECT_THROW(F::scaled_dot_product_attention(x, x, x, ones({4, 4}, DType::Bool), 0.0, /*is_causal=*/true), Error);
  EXPECT_THROW(F::qkv_attention(randn({2, 3, 10}), /*n_head=*/2), Error);  // 10 is not 3 * 2 * D
  EXPECT_THROW(F::qkv_attention(x, /*n_head=*/1), Error);                  // not (B, T, 3C)
  test::expect_error([] { F::rotary_embedding(randn({1, 2, 3, 5})); }, {"rotary_embedding: head size 5", "is odd"});
  EXPECT_THROW(F::rotary_embedding(randn({2, 3, 8})), Error);  // not (B, T, H, D)
  EXPECT_THROW(F::swiglu(randn({2, 3}), randn({3, 2})), Error);
  EXPECT_THROW(F::layer_norm(x, {7}), Error);
  EXPECT_THROW(F::layer_norm(x, {8}, ones({8}, DType::Float64)), Error);
  EXPECT_THROW(F::embedding(tensor({0, 9}, DType::Int64), randn({5, 3})), Error);
  EXPECT_THROW(F::embedding(tensor({0.0, 1.0}), randn({5, 3})), Error);
  EXPECT_THROW(F::cross_entropy(randn({2, 5}), tensor({0, 7}, DType::Int64)), Error);
}

}  // namespace
}  // namespace castor
