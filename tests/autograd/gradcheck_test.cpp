// Every differentiable op and view checked against float64 central finite differences, plus double backward.
#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

using Inputs = std::vector<Tensor>;

Tensor rnd(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, DType::Float64, &gen).requires_grad_();
}

// Values in [lo, hi), for ops defined only there (log, sqrt, pow with a fractional exponent).
Tensor rnd_in(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  return uniform(shape, lo, hi, DType::Float64, &gen).requires_grad_();
}

TEST(Gradcheck, BinaryBroadcasting) {
  const Tensor a = rnd({3, 4}, 1), row = rnd({4}, 2), col = rnd({3, 1}, 3), s0 = rnd({}, 4);
  const Tensor pos = rnd_in({3, 1}, 0.5, 2.0, 5);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return add(x[0], x[1], /*alpha=*/2.5); }, {a, row}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return sub(x[0], x[1], /*alpha=*/-0.5); }, {col, a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0] * x[1]; }, {a, col}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0] * x[1]; }, {s0, a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0] / x[1]; }, {a, pos}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[1] / x[0]; }, {pos, row}));
  // Only one side requires grad.
  EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return x[0] * col.detach() / pos.detach(); }, {a}));
}

TEST(Gradcheck, ScalarForms) {
  const Tensor a = rnd({2, 5}, 6);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return add(x[0], 1.5); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return mul(x[0], -3.25); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return 2.0 - x[0] / 4.0 + 0.5 * x[0]; }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return -x[0]; }, {a}));
}

TEST(Gradcheck, UnaryMaps) {
  const Tensor a = rnd({3, 7}, 7), pos = rnd_in({3, 7}, 0.2, 3.0, 8);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return pow(x[0], 2.0); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return pow(x[0], 3.0); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return pow(x[0], -1.5); }, {pos}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return exp(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return log(x[0]); }, {pos}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return sqrt(x[0]); }, {pos}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return abs(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return relu(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return sigmoid(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return tanh(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return gelu(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return gelu(x[0], /*tanh_approximate=*/true); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return clamp(x[0], -0.5, 0.7); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return clamp(x[0], std::nullopt, 0.3); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return clamp(x[0], -0.2, std::nullopt); }, {a}));
}

TEST(Gradcheck, Where) {
  const Tensor a = rnd({3, 4}, 9), b = rnd({4}, 10);
  const Tensor cond = gt(rnd({3, 4}, 11).detach(), zeros({}, DType::Float64));
  EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return where(cond, x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return where(cond, x[0], zeros({}, DType::Float64)); }, {a}));
}

TEST(Gradcheck, Reductions) {
  const Tensor a = rnd({3, 4, 5}, 12);
  for (bool keepdim : {false, true}) {
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return sum(x[0], {1}, keepdim); }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return sum(x[0], {0, 2}, keepdim); }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return mean(x[0], {-1}, keepdim); }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return mean(x[0], {2, 0}, keepdim); }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return max(x[0], 1, keepdim).first; }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return min(x[0], 2, keepdim).first; }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return max(x[0], 0, keepdim).first; }, {a}));
  }
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return sum(x[0]); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return mean(x[0]); }, {a}));
}

TEST(Gradcheck, Softmax) {
  const Tensor a = rnd({3, 4, 5}, 13);
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return softmax(x[0], dim); }, {a}));
    EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return log_softmax(x[0], dim); }, {a}));
  }
}

TEST(Gradcheck, MatrixProducts) {
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return mm(x[0], x[1]); }, {rnd({3, 4}, 14), rnd({4, 2}, 15)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return mm(x[0].t(), x[1]); }, {rnd({4, 3}, 14), rnd({4, 2}, 15)}));
  EXPECT_TRUE(
      test::gradcheck([](const Inputs& x) { return bmm(x[0], x[1]); }, {rnd({2, 3, 4}, 16), rnd({2, 4, 5}, 17)}));
  // matmul: broadcast batch dims, 1-D on either side, 1-D x 1-D, 1-D with a batch.
  EXPECT_TRUE(
      test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({2, 1, 3, 4}, 18), rnd({3, 4, 2}, 19)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({3, 4}, 20), rnd({4}, 21)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({4}, 22), rnd({4, 3}, 23)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({4}, 24), rnd({4}, 25)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({4}, 26), rnd({2, 4, 3}, 27)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return matmul(x[0], x[1]); }, {rnd({2, 3, 4}, 28), rnd({4}, 29)}));
}

TEST(Gradcheck, JoinAndGather) {
  const Tensor a = rnd({2, 3}, 30), b = rnd({2, 1}, 31), c = rnd({2, 3}, 32);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return cat({x[0], x[1], x[2]}, 1); }, {a, b, c}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return cat({x[0], x[1]}, 0); }, {a, c}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return stack({x[0], x[1]}, 1); }, {a, c}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return stack({x[0], x[1]}, -1); }, {a, c}));
  // A repeated index accumulates.
  const Tensor idx = tensor({0, 2, 2, 1, 0, 0}, {2, 3}, DType::Int64);
  EXPECT_TRUE(test::gradcheck([&](const Inputs& x) { return gather(x[0], 1, idx); }, {a}));
  const Tensor idx0 = tensor({1, 0, 1, 1, 1, 0, 0, 0}, {4, 2}, DType::Int64);
  EXPECT_TRUE(
      test::gradcheck([&](const Inputs& x) { return gather(x[0].t(), 0, idx0.narrow(1, 0, 2)); }, {rnd({2, 4}, 33)}));
}

TEST(Gradcheck, Views) {
  const Tensor a = rnd({2, 3, 4}, 34);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].view({6, 4}) * 1.0; }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].reshape({4, -1}); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].permute({2, 0, 1}).reshape({-1}); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].transpose(0, 2); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].narrow(2, 1, 2); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].slice(2, 0, 4, 3); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].slice(1, 1, 3, 2) * 3.0; }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].select(1, -1); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].expand({3, 2, 5}); }, {rnd({2, 1}, 35)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].squeeze(); }, {rnd({2, 1, 3, 1}, 36)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].squeeze(1).unsqueeze(0); }, {rnd({2, 1, 3}, 37)}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].flatten(1); }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].t().flatten(); }, {rnd({3, 4}, 38)}));
  // A view of a view of a non-contiguous tensor, reused twice.
  EXPECT_TRUE(test::gradcheck(
      [](const Inputs& x) {
        Tensor p = x[0].permute({1, 2, 0});
        return p.select(0, 1) * p.narrow(0, 0, 1).squeeze(0);
      },
      {a}));
}

TEST(Gradcheck, CopiesAndCasts) {
  const Tensor a = rnd({3, 4}, 39);
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].clone() * x[0]; }, {a}));
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].t().contiguous(); }, {a}));
  // Through float32 and back: the cast's gradient comes back as float64. The round trip loses precision,
  // so the finite difference is taken at float32 resolution.
  EXPECT_TRUE(test::gradcheck([](const Inputs& x) { return x[0].to(DType::Float32).to(DType::Float64) * x[0]; }, {a},
                              /*eps=*/1e-2, /*tol=*/1e-5));
}

TEST(Gradcheck, InPlaceOnNonLeaves) {
  const Tensor a = rnd({3, 4}, 40), b = rnd({4}, 41), c = rnd({3, 4}, 42);
  EXPECT_TRUE(test::gradcheck(
      [](const Inputs& x) {
        Tensor h = x[0] * 2.0;
        h.add_(x[1], /*alpha=*/0.5);
        h.mul_(x[2]);
        return tanh(h);
      },
      {a, b, c}));
  // Only self requires grad: mul_ by a constant tensor and by a scalar.
  EXPECT_TRUE(test::gradcheck(
      [&](const Inputs& x) {
        Tensor h = pow(x[0], 3.0);  // saves its input, which the writes below leave alone
        h.mul_(c.detach());
        h.add_(1.0);
        h.mul_(3.0);
        return h;
      },
      {a}));
  // In place on a view of a tensor with history would need the base's history rebased: refused, by name.
  Tensor h = a * 1.0;
  Tensor row = h.select(0, 1);
  test::expect_error([&] { row.mul_(b); }, {"mul_: in-place change of a view"});
}

// A gradient penalty ||d f / d x||^2 of a tanh MLP, differentiated again: analytic vs finite differences.
TEST(Gradcheck, DoubleBackwardGradientPenalty) {
  const Tensor x = rnd({4, 3}, 43), w1 = rnd({3, 5}, 44), w2 = rnd({5, 1}, 45);
  auto penalty = [](const Inputs& in) {
    const Tensor& xx = in[0];
    Tensor out = sum(matmul(tanh(matmul(xx, in[1])), in[2]));
    Tensor gx = grad({out}, {xx}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
    return sum(gx * gx, {1});
  };
  EXPECT_TRUE(test::gradcheck(penalty, {x, w1, w2}));
  // Through relu and sigmoid too (their composite backward forms).
  auto penalty2 = [](const Inputs& in) {
    Tensor out = sum(sigmoid(relu(matmul(in[0], in[1]))) * in[0].narrow(1, 0, 1));
    Tensor gx = grad({out}, {in[0]}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
    return mean(gx * gx);
  };
  EXPECT_TRUE(test::gradcheck(penalty2, {x, rnd({3, 2}, 46)}));
  // Through a strided slice and exp, softmax, sqrt (saved outputs).
  auto penalty3 = [](const Inputs& in) {
    Tensor h = matmul(in[0], in[1]);
    Tensor out = sum(softmax(exp(h), 1).slice(1, 0, 3, 2) * sqrt(in[0].slice(1, 1, 3) * in[0].slice(1, 1, 3) + 1.0));
    Tensor gx = grad({out}, {in[0]}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
    return gx * gx;
  };
  EXPECT_TRUE(test::gradcheck(penalty3, {x, rnd({3, 3}, 47)}));
  // Through log_softmax, div, pow, log, abs, clamp, where, mean and a broadcast sub.
  auto penalty4 = [](const Inputs& in) {
    Tensor h = matmul(in[0], in[1]);  // (4, 3)
    Tensor a = log_softmax(h, 1) / (abs(h) + 1.0);
    Tensor b = pow(clamp(h, -0.8, 0.8), 3.0) + log(h * h + 1.0);
    Tensor out = sum(where(gt(h.detach(), zeros({})), a, b)) + mean(sub(h, in[0].narrow(1, 0, 1), 0.5) * h);
    Tensor gx = grad({out}, {in[0]}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
    return gx * gx;
  };
  EXPECT_TRUE(test::gradcheck(penalty4, {x, rnd({3, 3}, 49)}));
  // Rules without a differentiable form say so instead of dropping terms.
  Tensor xm = rnd({3, 4}, 48);
  Tensor m = sum(max(xm * xm, 1).first);
  Tensor gm = grad({m}, {xm}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
  EXPECT_TRUE(gm.defined());  // max's incoming gradient is constant here: fine
  Tensor m2 = sum(max(xm, 1).first * max(xm, 1).first);
  EXPECT_THROW(grad({m2}, {xm}, {}, false, /*create_graph=*/true), Error);
}

}  // namespace
}  // namespace castor
