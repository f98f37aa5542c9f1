// The test case of every op row (castor/op_kind.h): what OpTable checks (gradients, autocast policy) and the cases
// TorchParity runs against PyTorch. A new op is its row, its definition (src/ops/) and its case here.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "castor/autocast.h"
#include "castor/tensor.h"

namespace castor::test {

using Inputs = std::vector<Tensor>;

struct OpCase {
  CastPolicy policy;  // what autocast must do to the op's floating inputs
  // "Suite.Test" comparing the op against PyTorch or a case worked by hand; "TorchParity" for a row whose
  // parity_cases() tests/core/torch_parity_test.cpp runs.
  const char* oracle;
  std::function<Tensor(const Inputs&)> fn;  // the op (its result, or a tensor computed from it)
  std::vector<Shape> shapes;  // of the op's floating inputs; values N(0, 1) (|x| + 0.5 where marked positive)
  bool positive = false;
  double fd_eps = 1e-6, fd_tol = 1e-6;  // finite differences (a cast through float32 needs a wide step)
  bool scoped = true;                   // passes an OpScope (Cast does not: it is what autocast itself calls)
};

// One op compared against PyTorch 1.13 forward and backward in float32, float16 and bfloat16 by TorchParity: the
// oracle (tests/oracle/ops_oracle.py) evaluates the Python fields and draws the inputs from the case's own seed
// (a CRC-32 of its name), so a new case changes no other's values.
struct ParityCase {
  std::string name;
  std::string klass;   // "<forward>:<backward>", each exact, ulp or reduce (tests/core/torch_parity_test.cpp)
  std::string inputs;  // Python list of makers: normal(*shape), positive(*shape), boolean(*shape),
                       // index(high, *shape) (int64 in [0, high)), special_f32() (float32 rounding edge cases)
  std::string torch;   // the op in PyTorch: a Python expression of x (the inputs) and d (the case dtype)
  std::function<Tensor(const Inputs&, DType)> fn;  // the op in Castor, of the inputs and the case dtype
  // PyTorch's derivative formula in float32 (a Python list expression of x (inputs, float32), y (the 16-bit output
  // in float32) and g (its gradient in float32)): the 16-bit reference of ulp and reduce classes, and of ops
  // PyTorch has no float16 kernel for. Empty where neither applies.
  std::string f32_grad = "";
  // The 16-bit forward reference: "native" (PyTorch's kernel; float32 where it has none), "float32" (computed in
  // float32, rounded once) or "float64" (every dtype: float64 forward and backward, rounded once).
  std::string reference = "native";
  std::string dtypes = "float32 float16 bfloat16";
};

const std::map<OpKind, OpCase>& op_cases();
const std::multimap<OpKind, ParityCase>& parity_cases();

}  // namespace castor::test
