// Tests looped over the op table (ggml's test-backend-ops style): every OpKind row must have a case
// (tests/autograd/op_cases.cpp), and each case runs a float64 gradcheck, checks the dtypes autocast gives the op
// against the policy written there from PyTorch 1.13's CPU autocast lists (independently of op_kind.h;
// docs/transformers.md lists where Castor and the CUDA lists differ), and names the test that compares the op
// against PyTorch or a worked oracle, or has TorchParity cases. An op added to the table without its case fails
// here, naming it.
#include <gtest/gtest.h>

#include "autograd/op_cases.h"
#include "castor/autograd.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "runtime/dispatch.h"
#include "test_util.h"

namespace castor {
namespace {

using test::Inputs;
using test::OpCase;

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

TEST(OpTable, ParityCasesBelongToTorchParityRows) {
  for (const auto& [op, c] : test::parity_cases()) {
    auto it = test::op_cases().find(op);
    ASSERT_NE(it, test::op_cases().end()) << c.name << ": " << op_name(op) << " has no case";
    EXPECT_EQ(std::string(it->second.oracle), "TorchParity")
        << c.name << ": " << op_name(op) << " names " << it->second.oracle << " as its oracle";
  }
}

TEST(OpTable, EveryOpHasItsCases) {
  for (int k = 0; k < kNumOps; ++k) {
    const auto op = static_cast<OpKind>(k);
    SCOPED_TRACE(op_name(op));
    auto it = test::op_cases().find(op);
    ASSERT_NE(it, test::op_cases().end()) << op_name(op) << " has no case in tests/autograd/op_cases.cpp";
    const OpCase& c = it->second;
    if (std::string(c.oracle) == "TorchParity")
      EXPECT_GT(test::parity_cases().count(op), 0u) << "no TorchParity case in tests/autograd/op_cases.cpp";
    else
      EXPECT_TRUE(is_registered(c.oracle)) << "no test " << c.oracle;
    EXPECT_EQ(op_policy(op), c.policy) << "op_kind.h says " << policy_name(op_policy(op));
    // float64 gradients against finite differences.
    if (c.policy != CastPolicy::Banned) {
      EXPECT_TRUE(test::gradcheck(c.fn, make_inputs(c, DType::Float64, true), c.fd_eps, c.fd_tol));
    }
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
