// Tests looped over the op table (ggml's test-backend-ops style): every OpKind row must have a case here, and each
// case runs a float64 gradcheck, checks the dtypes autocast gives the op against the policy written below from
// PyTorch 1.13's CPU autocast lists (independently of op_kind.h; docs/transformers.md lists where Castor and the
// CUDA lists differ), and names the test that compares the op against PyTorch or a worked oracle. An op added to
// the table without its case fails here, naming it.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "runtime/dispatch.h"
#include "test_util.h"

namespace castor {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;

struct OpCase {
  CastPolicy policy;       // what autocast must do to the op's floating inputs
  const char* oracle;      // "Suite.Test" comparing the op against PyTorch (or a case worked by hand)
  Fn fn;                   // the op (its result, or a tensor computed from it)
  std::vector<Shape> shapes;  // of the op's floating inputs; values N(0, 1) (|x| + 0.5 where marked positive)
  bool positive = false;
  double fd_eps = 1e-6, fd_tol = 1e-6;  // finite differences (a cast through float32 needs a wide step)
  bool scoped = true;      // passes an OpScope (Cast does not: it is what autocast itself calls)
};

struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::FunctionCtx& ctx, const Inputs& in) {
    ctx.save_for_backward({in[0]});
    return in[0] * in[0] * in[0];
  }
  static std::vector<Tensor> backward(autograd::FunctionCtx& ctx, const Tensor& g) {
    const Tensor& x = ctx.saved_tensors()[0];
    return {g * x * x * 3.0};
  }
};

Tensor idx(std::vector<double> v, Shape s) { return tensor(v, s, DType::Int64); }

const std::map<OpKind, OpCase>& op_cases() {
  using V = const Inputs&;
  using P = CastPolicy;
  const Shape m{3, 4};
  static const std::map<OpKind, OpCase> cases = {
      {OpKind::Add, {P::Promote, "TorchParity.Float32", [](V x) { return add(x[0], x[1], 2.0); }, {m, m}}},
      {OpKind::Sub, {P::Promote, "TorchParity.Float32", [](V x) { return sub(x[0], x[1]); }, {m, {4}}}},
      {OpKind::Mul, {P::Promote, "TorchParity.Float32", [](V x) { return x[0] * x[1]; }, {m, m}}},
      {OpKind::Div, {P::Promote, "TorchParity.Float32", [](V x) { return x[0] / x[1]; }, {m, m}, true}},
      {OpKind::Neg, {P::PassThrough, "TorchParity.Float32", [](V x) { return -x[0]; }, {m}}},
      {OpKind::Pow, {P::Float32, "TorchParity.Float32", [](V x) { return pow(x[0], 3.0); }, {m}}},
      {OpKind::Exp, {P::Float32, "TorchParity.Float32", [](V x) { return exp(x[0]); }, {m}}},
      {OpKind::Log, {P::Float32, "TorchParity.Float32", [](V x) { return log(x[0]); }, {m}, true}},
      {OpKind::Sqrt, {P::PassThrough, "TorchParity.Float32", [](V x) { return sqrt(x[0]); }, {m}, true}},
      {OpKind::Abs, {P::PassThrough, "TorchParity.Float32", [](V x) { return abs(x[0]); }, {m}}},
      {OpKind::Relu, {P::PassThrough, "TorchParity.Float32", [](V x) { return relu(x[0]); }, {m}}},
      {OpKind::Sigmoid, {P::PassThrough, "TorchParity.Float32", [](V x) { return sigmoid(x[0]); }, {m}}},
      {OpKind::Tanh, {P::PassThrough, "TorchParity.Float32", [](V x) { return tanh(x[0]); }, {m}}},
      {OpKind::Gelu, {P::PassThrough, "TorchParity.Float32", [](V x) { return gelu(x[0], true); }, {m}}},
      {OpKind::Silu, {P::PassThrough, "TorchParity.Float32", [](V x) { return silu(x[0]); }, {m}}},
      {OpKind::Clamp, {P::PassThrough, "TorchParity.Float32", [](V x) { return clamp(x[0], -0.5, 0.7); }, {m}}},
      {OpKind::Where,
       {P::Promote, "TorchParity.Float32", [](V x) { return where(gt(x[0].detach(), x[1].detach()), x[0], x[1]); },
        {m, m}}},
      {OpKind::Cast,
       {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].to(DType::Float32).to(DType::Float64); }, {m},
        false, 1e-2, 1e-4, false}},
      {OpKind::Sum, {P::Float32, "TorchParity.Float32", [](V x) { return sum(x[0], {1}); }, {m}}},
      {OpKind::Mean, {P::Float32, "TorchParity.Float32", [](V x) { return mean(x[0], {0}); }, {m}}},
      {OpKind::MaxDim, {P::PassThrough, "TorchParity.Float32", [](V x) { return max(x[0], 1).first; }, {m}}},
      {OpKind::MinDim, {P::PassThrough, "TorchParity.Float32", [](V x) { return min(x[0], 0).first; }, {m}}},
      {OpKind::Softmax, {P::Float32, "TorchParity.Float32", [](V x) { return softmax(x[0], 1); }, {m}}},
      {OpKind::LogSoftmax, {P::Float32, "TorchParity.Float32", [](V x) { return log_softmax(x[0], 0); }, {m}}},
      {OpKind::Matmul,
       {P::LowerPrecision, "TorchParity.Float32", [](V x) { return matmul(x[0], x[1]); }, {{2, 3, 4}, {4, 5}}}},
      {OpKind::Mm, {P::LowerPrecision, "TorchParity.Float32", [](V x) { return mm(x[0], x[1]); }, {m, {4, 2}}}},
      {OpKind::Bmm,
       {P::LowerPrecision, "TorchParity.Float32", [](V x) { return bmm(x[0], x[1]); }, {{2, 3, 4}, {2, 4, 5}}}},
      {OpKind::Addmm,
       {P::LowerPrecision, "TorchParity.Float32", [](V x) { return addmm(x[0], x[1], x[2]); }, {{2}, m, {4, 2}}}},
      // Views and copies keep their input's dtype and pass no OpScope.
      {OpKind::View, {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].view({4, 3}); }, {m}, false, 1e-6,
                      1e-6, false}},
      {OpKind::Permute, {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].permute({1, 0}); }, {m}, false,
                         1e-6, 1e-6, false}},
      {OpKind::Expand, {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].expand({2, 3, 4}); }, {m}, false,
                        1e-6, 1e-6, false}},
      {OpKind::Slice, {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].slice(1, 1, 4, 2); }, {m}, false,
                       1e-6, 1e-6, false}},
      {OpKind::Clone, {P::PassThrough, "TorchParity.Float32", [](V x) { return x[0].clone(); }, {m}, false, 1e-6,
                       1e-6, false}},
      {OpKind::Cat, {P::Promote, "TorchParity.Float32", [](V x) { return cat({x[0], x[1]}, 1); }, {m, {3, 2}}}},
      {OpKind::Stack, {P::Promote, "TorchParity.Float32", [](V x) { return stack({x[0], x[1]}, 0); }, {m, m}}},
      {OpKind::Gather,
       {P::PassThrough, "TorchParity.Float32",
        [](V x) { return gather(x[0], 1, idx({0, 3, 1, 1, 2, 0}, {3, 2})); }, {m}}},
      {OpKind::MaskedFill,
       {P::PassThrough, "TorchParity.Float32", [](V x) { return masked_fill(x[0], gt(x[0].detach(), zeros({})), 1.5); },
        {m}}},
      {OpKind::Linear,
       {P::LowerPrecision, "Gpt.Float32MatchesPyTorch", [](V x) { return F::linear(x[0], x[1], x[2]); },
        {{2, 3, 4}, {5, 4}, {5}}}},
      {OpKind::Conv2d,
       {P::LowerPrecision, "Functional.Conv2dMatchesTorch",
        [](V x) { return F::conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}); }, {{1, 2, 4, 4}, {3, 2, 3, 3}, {3}}}},
      {OpKind::Conv2dMaxPool2dRelu,
       {P::LowerPrecision, "ConvPoolFusion.MatchesTheThreeOpsBitForBit",
        [](V x) { return F::conv2d_max_pool2d_relu(x[0], x[1], x[2], {1, 1}, {1, 1}, {2, 2}); },
        {{1, 2, 4, 4}, {3, 2, 3, 3}, {3}}}},
      {OpKind::BatchNorm,
       {P::PassThrough, "Functional.BatchNormMatchesTorch",
        [](V x) { return F::batch_norm(x[0], {}, {}, x[1], x[2], /*training=*/true); }, {{3, 2, 2, 2}, {2}, {2}}}},
      {OpKind::MaxPool2d,
       {P::PassThrough, "Functional.PoolingMatchesTorch", [](V x) { return F::max_pool2d(x[0], {2, 2}); },
        {{1, 2, 4, 4}}}},
      {OpKind::AvgPool2d,
       {P::PassThrough, "Functional.PoolingMatchesTorch", [](V x) { return F::avg_pool2d(x[0], {2, 2}); },
        {{1, 2, 4, 4}}}},
      {OpKind::Dropout,
       {P::PassThrough, "FunctionalDropout.StatisticsAndBackwardMask",
        [](V x) { return F::dropout(x[0], 0.5, /*training=*/false); }, {m}}},
      {OpKind::Embedding,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::embedding(idx({1, 0, 1}, {3}), x[0]); },
        {{2, 4}}}},
      {OpKind::LayerNorm,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::layer_norm(x[0], {4}, x[1], x[2]); },
        {m, {4}, {4}}}},
      {OpKind::RmsNorm,
       {P::PassThrough, "TransformerOps.MatchPyTorch", [](V x) { return F::rms_norm(x[0], {4}, x[1]); }, {m, {4}}}},
      {OpKind::ScaledDotProductAttention,
       {P::LowerPrecision, "TransformerOps.MatchPyTorch",
        [](V x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true); },
        {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}}}},
      {OpKind::QkvAttention,
       {P::LowerPrecision, "TransformerOps.MatchPyTorch", [](V x) { return F::qkv_attention(x[0], /*n_head=*/2); },
        {{1, 3, 3 * 4}}}},
      {OpKind::CrossEntropy,
       {P::Float32InKernel, "TransformerOps.MatchPyTorch",
        [](V x) { return F::cross_entropy(x[0], idx({2, 0, 3}, {3})); }, {m}}},
      {OpKind::NllLoss,
       {P::Float32, "Functional.LossesMatchTorch", [](V x) { return F::nll_loss(x[0], idx({2, 0, 3}, {3})); }, {m}}},
      {OpKind::MseLoss, {P::Float32, "Functional.LossesMatchTorch", [](V x) { return F::mse_loss(x[0], x[1]); }, {m, m}}},
      {OpKind::BinaryCrossEntropyWithLogits,
       {P::Float32, "Functional.LossesMatchTorch",
        [](V x) { return F::binary_cross_entropy_with_logits(x[0], ones_like(x[0].detach()) * 0.25); }, {m}}},
      {OpKind::BinaryCrossEntropy,
       {P::Banned, "Functional.LossesMatchTorch",
        [](V x) { return F::binary_cross_entropy(sigmoid(x[0]), ones_like(x[0].detach()) * 0.25); }, {m}}},
      {OpKind::Function,
       {P::PassThrough, "AutogradFunction.GradientsMatchFiniteDifferences", [](V x) { return Cube::apply({x[0]}); },
        {m}, false, 1e-6, 1e-6, /*scoped=*/false}},  // its own policy: AutogradFunction.CustomFwdAndBwd*
  };
  return cases;
}

Inputs make_inputs(const OpCase& c, DType dtype, bool requires_grad) {
  Inputs in;
  uint64_t seed = 1;
  for (const Shape& s : c.shapes) {
    Generator gen(seed++);
    Tensor t = randn(s, DType::Float64, &gen);
    if (c.positive) t = abs(t) + 0.5;
    t = t.to(dtype);
    if (requires_grad) t.requires_grad_();
    in.push_back(t);
  }
  return in;
}

// Records the dtypes op `op` ran on, as the outermost call.
struct Ran : OpObserver {
  OpKind op;
  std::vector<DType> given, ran;
  bool seen = false;
  explicit Ran(OpKind k) : op(k) {}
  void on_op(const OpEvent& e) override {
    if (e.op != op || e.backward || seen) return;
    seen = true;
    for (const Tensor& t : *e.given) given.push_back(t.defined() ? t.dtype() : DType::Bool);
    for (const Tensor& t : *e.inputs) ran.push_back(t.defined() ? t.dtype() : DType::Bool);
  }
};

// The dtype autocast(bf16) must give a floating input of `given` dtype under `policy` (Promote: the widest given).
DType expected(CastPolicy policy, DType given, DType widest) {
  switch (policy) {
    case CastPolicy::LowerPrecision: return DType::BFloat16;
    case CastPolicy::Float32: return DType::Float32;
    case CastPolicy::Promote: return widest;
    default: return given;
  }
}

bool is_registered(const std::string& full) {
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j)
      if (std::string(suite->name()) + "." + suite->GetTestInfo(j)->name() == full) return true;
  }
  return false;
}

TEST(OpTable, EveryOpHasItsCases) {
  for (int k = 0; k < kNumOps; ++k) {
    const auto op = static_cast<OpKind>(k);
    SCOPED_TRACE(op_name(op));
    auto it = op_cases().find(op);
    ASSERT_NE(it, op_cases().end()) << op_name(op) << " has no case in tests/autograd/op_table_test.cpp";
    const OpCase& c = it->second;
    EXPECT_TRUE(is_registered(c.oracle)) << "no test " << c.oracle;
    EXPECT_EQ(op_policy(op), c.policy) << "op_kind.h says " << policy_name(op_policy(op));
    // float64 gradients against finite differences.
    if (c.policy != CastPolicy::Banned)
      EXPECT_TRUE(test::gradcheck(c.fn, make_inputs(c, DType::Float64, true), c.fd_eps, c.fd_tol));
    if (!c.scoped) continue;
    // Autocast: float32 inputs, then bfloat16 ones, then the first input bfloat16 and the rest float32.
    for (int variant = 0; variant < 3; ++variant) {
      Inputs in = make_inputs(c, variant == 1 ? DType::BFloat16 : DType::Float32, false);
      if (variant == 2) in[0] = in[0].to(DType::BFloat16);
      Ran ran(op);
      set_op_observer(&ran);
      amp::AutocastGuard autocast(DType::BFloat16);
      if (c.policy == CastPolicy::Banned) {
        EXPECT_THROW(c.fn(in), Error);
        set_op_observer(nullptr);
        continue;
      }
      c.fn(in);
      set_op_observer(nullptr);
      EXPECT_TRUE(ran.seen) << "the op did not pass its OpScope";
      DType widest = DType::BFloat16;
      for (DType d : ran.given)
        if (is_floating(d)) widest = promote_types(widest, d);
      for (size_t i = 0; i < ran.given.size(); ++i) {
        if (!is_floating(ran.given[i])) continue;
        EXPECT_EQ(ran.ran[i], expected(c.policy, ran.given[i], widest))
            << "input " << i << " given " << dtype_name(ran.given[i]) << ", variant " << variant;
      }
    }
  }
}

}  // namespace
}  // namespace castor
