// User-defined autograd::Function: gradients against finite differences, saved tensors, custom_fwd/custom_bwd.
#include <gtest/gtest.h>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

// x^3 * w, saving its inputs.
struct CubeTimes : autograd::Function<CubeTimes> {
  static Tensor forward(autograd::FunctionCtx& ctx, const std::vector<Tensor>& in) {
    EXPECT_FALSE(GradMode::is_enabled());  // forward records nothing
    ctx.save_for_backward({in[0], in[1]});
    return mul(mul(mul(in[0], in[0]), in[0]), in[1]);
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx& ctx, const Tensor& grad) {
    const Tensor& x = ctx.saved_tensors()[0];
    const Tensor& w = ctx.saved_tensors()[1];
    return {ctx.needs_input_grad()[0] ? mul(grad, mul(mul(mul(x, x), w), 3.0)) : Tensor(),
            ctx.needs_input_grad()[1] ? mul(grad, mul(mul(x, x), x)) : Tensor()};
  }
};

TEST(AutogradFunction, GradientsMatchFiniteDifferences) {
  Generator gen(1);
  const Tensor x = randn({3, 4}, DType::Float64, &gen), w = randn({3, 4}, DType::Float64, &gen);
  const Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
  EXPECT_TRUE(test::gradcheck([](const std::vector<Tensor>& in) { return CubeTimes::apply(in); }, {xg, wg}));
  // Composed with built-in ops on both sides, and with create_graph (its backward is made of ops).
  EXPECT_TRUE(test::gradcheck(
      [](const std::vector<Tensor>& in) {
        return exp(CubeTimes::apply({mul(in[0], 0.5), in[1]}));
      },
      {xg, wg}));
  const Tensor a = x.clone().requires_grad_();
  const Tensor g = grad({sum(CubeTimes::apply({a, w}))}, {a}, {}, /*retain_graph=*/false, /*create_graph=*/true)[0];
  const Tensor gg = grad({sum(g)}, {a})[0];  // d/dx sum(3 x^2 w) = 6 x w
  EXPECT_TRUE(test::close(gg, mul(mul(x, w), 6.0), 1e-12, 1e-12));
}

TEST(AutogradFunction, NoGradientForInputsThatNeedNone) {
  const Tensor x = full({2}, 2.0).requires_grad_(), w = full({2}, 3.0);
  const Tensor y = CubeTimes::apply({x, w});
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{36, 36}));  // 3 x^2 w
  EXPECT_FALSE(w.grad().defined());
  NoGradGuard no_grad;
  EXPECT_FALSE(CubeTimes::apply({x, w}).requires_grad());
}

TEST(AutogradFunction, InPlaceChangeOfASavedTensorIsAnError) {
  const Tensor x = full({2}, 2.0).requires_grad_();
  Tensor w = full({2}, 3.0);
  const Tensor y = CubeTimes::apply({x, w});
  w.add_(1.0);
  EXPECT_THROW(sum(y).backward(), Error);
}

// Returns the wrong number of gradients.
struct Broken : autograd::Function<Broken> {
  static Tensor forward(autograd::FunctionCtx&, const std::vector<Tensor>& in) { return in[0]; }
  static std::vector<Tensor> backward(autograd::FunctionCtx&, const Tensor& grad) { return {grad, grad}; }
};

TEST(AutogradFunction, BackwardReturningTheWrongGradientsIsAnError) {
  const Tensor x = full({2}, 2.0).requires_grad_();
  const Tensor y = Broken::apply({x});
  EXPECT_FALSE(y.is_same(x));  // an output aliasing its input gets its own history
  test::expect_error([&] { sum(y).backward(); }, {"backward returned 2 gradients for 1 inputs"});
}

// Records the autocast state its forward and backward ran under.
struct Seen {
  static inline DType forward_input = DType::Float32;
  static inline bool forward_autocast = false, backward_autocast = false;
};

// custom_fwd(cast_inputs=torch.float32) + custom_bwd: registered in the cast policy as a float32 op.
struct Float32Op : autograd::Function<Float32Op> {
  static inline const amp::CustomOp autocast_op = amp::register_op("test_float32_square", CastPolicy::Float32);
  static Tensor forward(autograd::FunctionCtx& ctx, const std::vector<Tensor>& in) {
    Seen::forward_input = in[0].dtype();
    Seen::forward_autocast = amp::is_autocast_enabled();
    ctx.save_for_backward({in[0]});
    return mul(in[0], in[0]);
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx& ctx, const Tensor& grad) {
    Seen::backward_autocast = amp::is_autocast_enabled();
    return {mul(mul(grad, ctx.saved_tensors()[0]), 2.0)};
  }
};

// custom_fwd without cast_inputs + custom_bwd: runs under the caller's autocast state.
struct PlainOp : autograd::Function<PlainOp> {
  static Tensor forward(autograd::FunctionCtx&, const std::vector<Tensor>& in) {
    Seen::forward_input = in[0].dtype();
    Seen::forward_autocast = amp::is_autocast_enabled();
    return mm(in[0], in[0]);  // autocast applies to the ops inside
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx&, const Tensor& grad) {
    Seen::backward_autocast = amp::is_autocast_enabled();
    return {grad};
  }
};

TEST(AutogradFunction, CustomFwdAndBwdFollowTheCastPolicy) {
  const Tensor x = full({2, 2}, 3.0, DType::BFloat16).requires_grad_();
  Tensor y;
  {
    amp::AutocastGuard autocast(DType::BFloat16);
    y = Float32Op::apply({x});
  }
  EXPECT_EQ(Seen::forward_input, DType::Float32);  // cast by the registered policy
  EXPECT_FALSE(Seen::forward_autocast);            // and run with autocast off, as custom_fwd(cast_inputs=...)
  EXPECT_EQ(y.dtype(), DType::Float32);
  sum(y).backward();
  EXPECT_FALSE(Seen::backward_autocast);         // custom_bwd: the state forward ran under
  EXPECT_EQ(x.grad().dtype(), DType::BFloat16);  // gradients flow back in the input's dtype
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{6, 6, 6, 6}));
  EXPECT_THROW(amp::register_op("test_float32_square", CastPolicy::LowerPrecision), Error);

  const Tensor z = full({2, 2}, 1.0).requires_grad_();
  Tensor out;
  {
    amp::AutocastGuard autocast(DType::BFloat16);
    out = PlainOp::apply({z});
  }
  EXPECT_EQ(Seen::forward_input, DType::Float32);
  EXPECT_TRUE(Seen::forward_autocast);
  EXPECT_EQ(out.dtype(), DType::BFloat16);  // mm inside ran under autocast
  EXPECT_FALSE(amp::is_autocast_enabled());
  backward({out}, {full({2, 2}, 1.0, DType::BFloat16)});
  EXPECT_TRUE(Seen::backward_autocast);  // backward restores the forward's enabled state
  EXPECT_FALSE(amp::is_autocast_enabled());
}

}  // namespace
}  // namespace castor
