// The tensor core's contracts: views and storage, version counters, autograd engine behaviour, error messages,
// the random generator and the allocator statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

using test::expect_error;

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// ---- views and storage ----

TEST(TensorViews, ShareStorage) {
  Tensor x = arange(12, DType::Float32).view({3, 4});
  Tensor v = x.t();
  Tensor s = x.select(0, 1);
  Tensor n = x.narrow(1, 1, 2);
  for (const Tensor& view : {v, s, n, x.slice(1, 0, 4, 2), x.unsqueeze(0), x.flatten(), x.expand({2, 3, 4})})
    EXPECT_EQ(view.impl()->storage, x.impl()->storage);
  EXPECT_EQ(s.storage_offset(), 4);
  EXPECT_EQ(n.storage_offset(), 1);
  {
    NoGradGuard no_grad;
    s.fill_(-1);  // writes through to x
  }
  EXPECT_EQ(values(x.select(0, 1)), (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(values(v.select(1, 1)), (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(values(n), (std::vector<float>{1, 2, -1, -1, 9, 10}));
}

// torch.split / torch.chunk's pieces (worked by hand: 7 along dim 1 in 3s is 3, 3, 1; chunk(3) of 7 is 3, 3, 1;
// chunk(4) of 6 is 2, 2, 2), views whose gradients land in their own columns.
TEST(TensorViews, SplitAndChunk) {
  const Tensor x = arange(14).to(DType::Float32).view({2, 7}).requires_grad_();
  const std::vector<Tensor> parts = x.split(3, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].shape(), (Shape{2, 1}));
  EXPECT_EQ(parts[1].to_vector<double>(), (std::vector<double>{3, 4, 5, 10, 11, 12}));
  EXPECT_EQ(x.chunk(3, -1).size(), 3u);
  EXPECT_EQ(zeros({6}).chunk(4).size(), 3u);
  sum(parts[1] * 2.0).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 0}));
  EXPECT_THROW(x.split(0, 1), Error);
  EXPECT_THROW(x.chunk(0), Error);
}

TEST(TensorViews, Strides) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_EQ(x.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(x.permute({2, 0, 1}).strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(x.permute({2, 0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(x.transpose(0, 2).strides(), (Shape{1, 4, 12}));
  Tensor col = zeros({3, 1});
  EXPECT_EQ(col.expand({2, 3, 5}).strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(x.slice(2, 1, 4, 2).strides(), (Shape{12, 4, 2}));
  EXPECT_EQ(x.slice(2, 1, 4, 2).shape(), (Shape{2, 3, 2}));
  EXPECT_FALSE(x.permute({2, 0, 1}).is_contiguous());
  EXPECT_TRUE(x.narrow(0, 1, 1).is_contiguous());
}

TEST(TensorViews, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = arange(6, DType::Float32).view({2, 3});
  EXPECT_TRUE(x.contiguous().is_same(x));
  Tensor c = x.t().contiguous();
  EXPECT_NE(c.impl()->storage, x.impl()->storage);
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_EQ(values(c), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorViews, ReshapeCopiesOnlyWhenNeeded) {
  Tensor x = arange(24, DType::Float32).view({2, 3, 4});
  EXPECT_EQ(x.reshape({6, 4}).impl()->storage, x.impl()->storage);
  // Merging dims that stay adjacent in memory is still a view.
  Tensor p = x.permute({1, 0, 2});  // (3, 2, 4), strides (4, 12, 1)
  EXPECT_EQ(p.reshape({3, 2, 2, 2}).impl()->storage, x.impl()->storage);
  // Merging the permuted dims cannot be a view.
  Tensor r = p.reshape({6, 4});
  EXPECT_NE(r.impl()->storage, x.impl()->storage);
  EXPECT_EQ(values(r.select(0, 1)), (std::vector<float>{12, 13, 14, 15}));
  expect_error([&] { p.view({6, 4}); }, {"view", "[6, 4]", "reshape"});
  expect_error([&] { x.view({5, -1}); }, {"view", "[5, -1]", "24"});
}

// ---- memory formats ----

TEST(TensorLayout, ChannelsLastStridesAndPredicates) {
  Tensor x = arange(2 * 3 * 4 * 5, DType::Float32).view({2, 3, 4, 5});
  Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.shape(), x.shape());
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));  // (HWC, 1, WC, C)
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(cl.is_dense());
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_EQ(values(cl), values(x));  // same values in logical order
  // Element (n, c, h, w) lies at n*60 + h*15 + w*3 + c in memory.
  const float* p = cl.data<float>();
  EXPECT_EQ(p[1 * 60 + 2 * 15 + 3 * 3 + 1], x.select(0, 1).select(0, 1).select(0, 2).select(0, 3).item());
  EXPECT_TRUE(cl.contiguous(MemoryFormat::ChannelsLast).is_same(cl));
  EXPECT_EQ(values(cl.contiguous()), values(x));
  EXPECT_TRUE(cl.contiguous().is_contiguous());
  // One channel or a 1x1 image: both layouts at once, and contiguous is what it suggests.
  Tensor one = zeros({2, 1, 3, 3});
  EXPECT_TRUE(one.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(one.suggest_memory_format(), MemoryFormat::Contiguous);
  // Dense but neither; not dense; and only 4-D tensors can be channels-last.
  EXPECT_TRUE(x.permute({3, 1, 0, 2}).is_dense());
  EXPECT_FALSE(x.slice(3, 0, 5, 2).is_dense());
  EXPECT_FALSE(x.expand({2, 2, 3, 4, 5}).is_dense());
  EXPECT_FALSE(zeros({4, 5}).is_contiguous(MemoryFormat::ChannelsLast));
  expect_error([&] { zeros({4, 5}).contiguous(MemoryFormat::ChannelsLast); }, {"channels-last", "4-D", "[4, 5]"});
}

TEST(TensorLayout, ElementwiseOpsKeepChannelsLast) {
  Generator gen(11);
  Tensor a = randn({2, 3, 4, 5}, DType::Float32, &gen), b = randn({2, 3, 4, 5}, DType::Float32, &gen);
  Tensor bias = randn({3, 1, 1}, DType::Float32, &gen);
  Tensor acl = a.contiguous(MemoryFormat::ChannelsLast), bcl = b.contiguous(MemoryFormat::ChannelsLast);
  auto expect_cl_equal = [](const Tensor& got, const Tensor& want) {
    EXPECT_EQ(got.suggest_memory_format(), MemoryFormat::ChannelsLast) << got.describe();
    EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
  };
  expect_cl_equal(acl + bcl, a + b);
  expect_cl_equal(acl * b, a * b);  // mixed layouts: the first dense operand of the full shape decides
  expect_cl_equal(acl + bias, a + bias);
  expect_cl_equal(relu(acl), relu(a));
  expect_cl_equal(mul(acl, 0.5), mul(a, 0.5));
  expect_cl_equal(acl.clone(), a);
  expect_cl_equal(empty_like(acl).copy_(a), a);
  expect_cl_equal(acl.to(DType::BFloat16).to(DType::Float32), a.to(DType::BFloat16).to(DType::Float32));
  EXPECT_EQ((a * bcl).suggest_memory_format(), MemoryFormat::Contiguous);
  // Gradients flow back through the layout change into the contiguous leaf, in its layout.
  Tensor leaf = a.detach().requires_grad_();
  Tensor y = relu(leaf.contiguous(MemoryFormat::ChannelsLast) * bcl);
  backward({sum(y)});
  EXPECT_TRUE(leaf.grad().is_contiguous());
  EXPECT_EQ(values(leaf.grad()), values(where(gt(a * b, zeros_like(a)), b, zeros_like(b))));
}

// ---- version counter and autograd engine ----

TEST(TensorAutograd, InPlaceBumpsVersion) {
  Tensor x = zeros({3});
  const uint32_t v0 = x.version();
  x.add_(1.0);
  EXPECT_EQ(x.version(), v0 + 1);
  Tensor view = x.narrow(0, 0, 2);
  view.mul_(ones({2}));
  EXPECT_EQ(x.version(), v0 + 2);  // the counter is shared with views
  x.copy_(ones({3}));
  x.clamp_(0, 0.5);
  EXPECT_EQ(x.version(), v0 + 4);
  EXPECT_EQ(values(x), (std::vector<float>{0.5, 0.5, 0.5}));
}

TEST(TensorAutograd, ModifiedSavedTensorRaisesNamingTheOp) {
  Tensor x = tensor({1, 2, 3}).requires_grad_();
  Tensor y = x * 2.0;
  Tensor z = sum(y * y);  // mul saves y
  y.add_(1.0);
  expect_error([&] { z.backward(); }, {"modified by an in-place operation", "mul", "float32[3]"});
  // exp saves its output: changing the output in place breaks exp's backward, not an unrelated graph's.
  Tensor e = exp(x * 1.0);
  Tensor loss = sum(e);
  e.mul_(2.0);
  sum(exp(x)).backward();
  expect_error([&] { loss.backward(); }, {"modified by an in-place operation", "exp"});
}

TEST(TensorAutograd, BackwardTwiceNeedsRetainGraph) {
  Tensor x = tensor({1, 2}).requires_grad_();
  Tensor y = sum(x * x);
  y.backward();
  expect_error([&] { y.backward(); }, {"second time", "retain_graph"});

  Tensor a = tensor({1, 2}).requires_grad_();
  Tensor b = sum(a * a * a);
  b.backward({}, /*retain_graph=*/true);
  b.backward();
  EXPECT_EQ(values(a.grad()), (std::vector<float>{6, 24}));  // 2 * 3 a^2
}

TEST(TensorAutograd, NoGradAndDetach) {
  Tensor x = tensor({1, 2}).requires_grad_();
  {
    NoGradGuard no_grad;
    Tensor y = x * x;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(GradMode::is_enabled());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  Tensor y = x * 3.0;
  Tensor d = y.detach();
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.impl()->storage, y.impl()->storage);
  Tensor loss = sum(y * d);  // d is a constant: d(loss)/dx = 3 d
  loss.backward();
  EXPECT_EQ(values(x.grad()), (std::vector<float>{9, 18}));
}

TEST(TensorAutograd, HooksReplaceGradients) {
  Tensor x = tensor({1, 2, 3}).requires_grad_();
  std::vector<float> seen_leaf, seen_mid;
  x.register_hook([&](const Tensor& g) {
    seen_leaf = values(g);
    return g * 10.0;
  });
  Tensor mid = x * 2.0;
  mid.register_hook([&](const Tensor& g) {
    seen_mid = values(g);
    return Tensor();  // keep it
  });
  mid.register_hook([](const Tensor& g) { return g + 1.0; });
  mid.retain_grad();
  sum(mid * mid).backward();
  // d/dmid = 2 mid = 4 x; +1 by the second hook; x gets 2 * that, then x10 by its hook.
  EXPECT_EQ(seen_mid, (std::vector<float>{4, 8, 12}));
  EXPECT_EQ(values(mid.grad()), (std::vector<float>{5, 9, 13}));
  EXPECT_EQ(seen_leaf, (std::vector<float>{10, 18, 26}));
  EXPECT_EQ(values(x.grad()), (std::vector<float>{100, 180, 260}));
}

TEST(TensorAutograd, LeafGradAccumulatesInLeafDtype) {
  Tensor x = tensor({1, 2}).requires_grad_();
  sum(x * x).backward();
  sum(x * 3.0).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<float>{5, 7}));
  EXPECT_EQ(x.grad().dtype(), DType::Float32);

  Tensor b = tensor({1.5, -2}, DType::BFloat16).requires_grad_();
  sum(b * b).backward();
  EXPECT_EQ(b.grad().dtype(), DType::BFloat16);
  EXPECT_EQ(values(b.grad()), (std::vector<float>{3, -4}));
  sum(b).backward();
  EXPECT_EQ(b.grad().dtype(), DType::BFloat16);
  EXPECT_EQ(values(b.grad()), (std::vector<float>{4, -3}));
}

TEST(TensorAutograd, CastGradientFlowsBackInSourceDtype) {
  Tensor x = tensor({0.1, 0.2, 0.3}).requires_grad_();
  Tensor h = x.to(DType::BFloat16);
  Tensor w = tensor({1, 2, 3}, DType::BFloat16);
  sum(h * w).backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(values(x.grad()), (std::vector<float>{1, 2, 3}));

  Tensor hleaf = tensor({0.5, 0.25}, DType::Float16).requires_grad_();
  Tensor f = hleaf.to(DType::Float32);
  sum(f * tensor({3, 5})).backward();
  EXPECT_EQ(hleaf.grad().dtype(), DType::Float16);
  EXPECT_EQ(values(hleaf.grad()), (std::vector<float>{3, 5}));
}

TEST(TensorAutograd, InPlaceOnLeafRequiringGradRaises) {
  Tensor x = tensor({1, 2}).requires_grad_();
  expect_error([&] { x.add_(ones({2})); }, {"add_", "leaf"});
  NoGradGuard no_grad;
  x.add_(ones({2}));  // allowed under no_grad (optimizer updates)
  EXPECT_EQ(values(x), (std::vector<float>{2, 3}));
}

// ---- error messages ----

TEST(TensorErrors, NameOpAndShapes) {
  expect_error([] { add(zeros({2, 3}), zeros({4})); }, {"add", "[2, 3]", "[4]"});
  expect_error([] { mul(zeros({2, 3}), zeros({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"});
  expect_error([] { sum(zeros({2, 3}), {2}); }, {"sum", "dim 2", "out of range"});
  expect_error([] { softmax(zeros({2, 3}), -3); }, {"softmax", "dim -3"});
  expect_error([] { zeros({2, 3}).transpose(0, 3); }, {"transpose", "dim 3"});
  expect_error([] { zeros({2, 3}).permute({0, 0}); }, {"permute", "repeated"});
  expect_error([] { mm(zeros({2, 3}), zeros({4, 2})); }, {"mm", "[2, 3]", "[4, 2]"});
  expect_error([] { mm(zeros({2, 3}), zeros({3, 2}, DType::BFloat16)); }, {"mm", "float32[2, 3]", "bfloat16[3, 2]"});
  expect_error([] { matmul(zeros({2, 3, 4}), zeros({5, 2})); }, {"matmul", "[2, 3, 4]", "[5, 2]"});
  expect_error([] { cat({zeros({2, 3}), zeros({3, 3})}, 1); }, {"cat", "float32[2, 3]", "float32[3, 3]"});
  expect_error([] { zeros({2, 3}).expand({4, 3}); }, {"expand", "[4, 3]"});
  expect_error([] { zeros({2}).item(); }, {"item", "float32[2]"});
  expect_error([] { sum(zeros({2}) * 1.0).backward(); }, {"backward", "does not require grad"});
  expect_error([] { tensor({1, 2}).requires_grad_().backward(); }, {"scalar", "float32[2]"});
}

// ---- reductions over 16-bit inputs ----

TEST(TensorReductions, SixteenBitAccumulatesInFloat32) {
  for (DType d : {DType::BFloat16, DType::Float16}) {
    Tensor s = sum(ones({1000}, d));
    EXPECT_EQ(s.dtype(), d);
    EXPECT_EQ(s.item(), 1000) << dtype_name(d);
    EXPECT_EQ(mean(full({4096}, 0.1, d)).item(), full({}, 0.1, d).item()) << dtype_name(d);
    EXPECT_EQ(sum(ones({1000}, d), {}, false, DType::Float32).dtype(), DType::Float32);
  }
  // A rowwise sum over the inner dim and a columnwise one over the outer dim.
  EXPECT_EQ(values(sum(ones({3, 700}, DType::BFloat16), {1})), (std::vector<float>{700, 700, 700}));
  EXPECT_EQ(values(sum(ones({700, 2}, DType::BFloat16), {0})), (std::vector<float>{700, 700}));
}

// A sum over the outer dim with many columns (a bias gradient: (R, C) over R) is split into column tasks across
// threads; each column must still be its values summed in row order (hand-worked: the same double sum, rounded
// once), across the ragged last task and with more than one outer index.
TEST(TensorReductions, ColumnSumsOverManyColumnsKeepTheRowOrder) {
  const int64_t O = 2, R = 37, C = 1300;
  const Tensor x = randn({O, R, C});
  for (DType d : {DType::Float32, DType::BFloat16}) {
    const Tensor xd = x.to(d);
    const std::vector<float> in = xd.to_vector<float>();
    std::vector<float> want(O * C);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t r = 0; r < R; ++r) acc += in[(o * R + r) * C + c];
        want[o * C + c] = static_cast<float>(acc);
      }
    const Tensor oracle = tensor(std::vector<double>(want.begin(), want.end()), Shape{O, C}, DType::Float32).to(d);
    EXPECT_TRUE(test::bit_equal(sum(xd, {1}), oracle)) << dtype_name(d);
  }
}

// Values PyTorch 1.13 gives: torch.relu(tensor([-0., nan, -1., 2.])) == [-0., nan, 0., 2.], in every float dtype.
TEST(TensorOps, ReluKeepsNegativeZeroAndNaN) {
  for (DType d : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Tensor r = relu(tensor({-0.0, NAN, -1.0, 2.0}, d));
    EXPECT_TRUE(test::bit_equal(r, tensor({-0.0, NAN, 0.0, 2.0}, d))) << dtype_name(d);
    EXPECT_TRUE(std::signbit(r.to_vector<float>()[0])) << dtype_name(d);
    EXPECT_TRUE(std::isnan(r.to_vector<float>()[1])) << dtype_name(d);
  }
}

// ---- random numbers ----

TEST(TensorRandom, SameSeedSameDraws) {
  Generator a(42), b(42), c(43);
  EXPECT_TRUE(test::bit_equal(randn({100}, DType::Float32, &a), randn({100}, DType::Float32, &b)));
  EXPECT_FALSE(test::bit_equal(rand({100}, DType::Float32, &a), rand({100}, DType::Float32, &c)));
  manual_seed(7);
  Tensor x = rand({10});
  manual_seed(7);
  EXPECT_TRUE(test::bit_equal(rand({10}), x));
}

TEST(TensorRandom, StateRestoreReproducesEveryFactory) {
  using Draw = std::function<Tensor(Generator*)>;
  const std::vector<std::pair<const char*, Draw>> draws = {
      {"uniform", [](Generator* g) { return uniform({33}, -2, 3, DType::Float32, g); }},
      {"normal", [](Generator* g) { return normal({33}, 1, 2, DType::Float64, g); }},
      {"bernoulli", [](Generator* g) { return bernoulli({33}, 0.3, DType::Float32, g); }},
      {"randint", [](Generator* g) { return randint(-5, 5, {33}, g); }},
      {"randperm", [](Generator* g) { return randperm(33, g); }},
  };
  for (const auto& [name, draw] : draws) {
    Generator g(5);
    randn({3}, DType::Float32, &g);  // an odd count leaves a cached normal in the state
    const Generator::State saved = g.state();
    Tensor first = draw(&g), next = randn({5}, DType::Float32, &g);
    g.set_state(saved);
    EXPECT_TRUE(test::bit_equal(draw(&g), first)) << name;
    EXPECT_TRUE(test::bit_equal(randn({5}, DType::Float32, &g), next)) << name;
  }
}

// discard(n) is n calls of next_u64: below, at and past the 256 steps its jump polynomial covers, and composed.
TEST(TensorRandom, DiscardIsThatManyDraws) {
  for (uint64_t n : {0, 1, 2, 255, 256, 257, 1000, 100003}) {
    Generator jumped(9), stepped(9);
    jumped.next_normal();  // a cached normal stays cached, as next_u64 leaves it
    stepped.next_normal();
    jumped.discard(n);
    for (uint64_t i = 0; i < n; ++i) stepped.next_u64();
    EXPECT_EQ(jumped.state(), stepped.state()) << n;
    EXPECT_EQ(jumped.next_normal(), stepped.next_normal()) << n;
  }
  Generator once(4), twice(4);
  once.discard(uint64_t{3} << 40);
  twice.discard(uint64_t{1} << 40);
  twice.discard(uint64_t{1} << 41);
  EXPECT_EQ(once.state(), twice.state());
  Generator normals(5), drawn(5);
  for (int64_t n : {3, 0, 1, 4, 1001, 2}) {  // odd counts leave a cached normal, and the next count starts from it
    normals.discard_normals(n);
    for (int64_t i = 0; i < n; ++i) drawn.next_normal();
    EXPECT_EQ(normals.state(), drawn.state()) << n;
  }
}

// normal() fills a tensor with the values of next_normal() one by one (past the size that goes parallel, each
// thread draws from its own generator jumped ahead): in order, across tensors of odd sizes that leave a cached
// value, and in place by normal_.
TEST(TensorRandom, NormalTensorsAreNextNormalsInOrder) {
  Generator bulk(3), one_by_one(3);
  for (int64_t n : {1, 4, 7, 0, 2, 200001, 3, 2097157, 100000}) {
    const std::vector<double> got = normal({n}, 1.5, 0.25, DType::Float64, &bulk).to_vector<double>();
    ASSERT_EQ(got.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double want = 1.5 + 0.25 * one_by_one.next_normal();
      ASSERT_EQ(got[i], want) << "element " << i << " of " << n;
    }
    EXPECT_EQ(bulk.state(), one_by_one.state()) << n;
  }
  const Tensor f = normal({9}, 0.0, 0.02, DType::Float32, &bulk);
  for (int64_t i = 0; i < 9; ++i)
    EXPECT_EQ(f.to_vector<float>()[i], static_cast<float>(0.02 * one_by_one.next_normal()));
  const Tensor b = zeros({300, 301}, DType::BFloat16);
  const uint32_t version = b.version();
  normal_(b, 1.0, 3.0, &bulk);
  EXPECT_TRUE(test::bit_equal(b, normal({300, 301}, 1.0, 3.0, DType::BFloat16, &one_by_one)));
  EXPECT_EQ(b.version(), version + 1);
  EXPECT_EQ(bulk.state(), one_by_one.state());
  EXPECT_THROW(normal_(b.transpose(0, 1), 0.0, 1.0), Error);
}

TEST(TensorRandom, Statistics) {
  Generator g(11);
  const int64_t n = 200000;
  auto moments = [](const Tensor& t) {
    auto v = t.to_vector<double>();
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) s += (x - m) * (x - m);
    return std::pair<double, double>{m, s / v.size()};
  };
  // Bounds are about 6 standard errors.
  auto [um, uv] = moments(uniform({n}, -1, 3, DType::Float32, &g));
  EXPECT_NEAR(um, 1.0, 0.02);
  EXPECT_NEAR(uv, 16.0 / 12, 0.02);
  auto [nm, nv] = moments(normal({n}, 2, 3, DType::Float64, &g));
  EXPECT_NEAR(nm, 2.0, 0.05);
  EXPECT_NEAR(nv, 9.0, 0.2);
  auto [bm, bv] = moments(bernoulli({n}, 0.3, DType::Float32, &g));
  EXPECT_NEAR(bm, 0.3, 0.007);
  EXPECT_NEAR(bv, 0.21, 0.007);
  Tensor ri = randint(-3, 4, {n}, &g);
  auto [rm, rv] = moments(ri);
  EXPECT_NEAR(rm, 0.0, 0.03);
  EXPECT_NEAR(rv, 4.0, 0.05);  // (7^2 - 1) / 12
  EXPECT_EQ(max(ri).item(), 3);
  EXPECT_EQ(min(ri).item(), -3);
  auto perm = randperm(1000, &g).to_vector<int64_t>();
  EXPECT_EQ(std::set<int64_t>(perm.begin(), perm.end()).size(), 1000u);
  EXPECT_EQ(*std::min_element(perm.begin(), perm.end()), 0);
  EXPECT_EQ(*std::max_element(perm.begin(), perm.end()), 999);
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += perm[i] == i;
  EXPECT_LT(fixed, 10);  // a shuffle, not the identity (1 fixed point expected)
}

// ---- allocator ----

TEST(TensorAllocator, StatsTrackExactBytesPerDtype) {
  const MemoryStats before = memory_stats();
  const int bf = static_cast<int>(DType::BFloat16), f = static_cast<int>(DType::Float32);
  {
    Tensor a = empty({1000, 3}, DType::BFloat16);
    Tensor b = empty({77}, DType::Float32);
    Tensor v = a.t();  // a view allocates nothing
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.current_by_dtype[bf] - before.current_by_dtype[bf], 6000);
    EXPECT_EQ(during.current_by_dtype[f] - before.current_by_dtype[f], 308);
    EXPECT_EQ(during.current_bytes - before.current_bytes, 6308);
    reset_peak_memory_stats();
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.current_by_dtype[bf], before.current_by_dtype[bf]);
  EXPECT_EQ(after.peak_bytes, before.current_bytes + 6308);
  EXPECT_EQ(after.peak_by_dtype[bf], before.current_by_dtype[bf] + 6000);
  {
    Tensor c = empty({5000}, DType::BFloat16);
    EXPECT_EQ(memory_stats().peak_by_dtype[bf], before.current_by_dtype[bf] + 10000);
  }
}

}  // namespace
}  // namespace castor
