// The GELU (tanh form) element-wise kernels (kernels::unary GeluTanh, kernels::binary GeluTanhGrad; AVX-512 where the
// CPU has it, else AVX2, src/kernels/cpu/gelu.cpp; IsaCap.AVX2 runs this under ONEDNN_MAX_CPU_ISA=AVX2) against the
// float64 reference loops on the same values, rounded once:
// float32 within 8 ulps (the contract TorchParity holds them to; the fast kernels compute float32 in float64), bfloat16
// and float16 within 1 ulp. The sizes cover
// several parallel blocks and a partial vector at the end (16, 8 and 4 lanes); the values reach the tails (|x| up to 12) and 0.
#include <gtest/gtest.h>

#include <cmath>

#include "castor/random.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace castor {
namespace {

// The largest |got - want| in ulps of want's magnitude in dt (2^-23, 2^-7, 2^-10 relative; subnormals at the
// smallest normal's ulp).
double max_ulps(const Tensor& got, const Tensor& want, DType dt) {
  const int mant = dt == DType::Float32 ? 23 : dt == DType::BFloat16 ? 7 : 10;
  const double tiny = dt == DType::Float16 ? 0x1p-14 : 0x1p-126;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(w[i]), tiny)) - mant);
    worst = std::max(worst, std::abs(g[i] - w[i]) / ulp);
  }
  return worst;
}

TEST(GeluKernels, MatchTheFloat64ReferenceRoundedOnce) {
  Generator gen(7);
  Tensor x64 = randn({5003}, DType::Float64, &gen).mul_(3.0), g64 = randn({5003}, DType::Float64, &gen);
  x64.narrow(0, 0, 3).copy_(tensor({0.0, 12.0, -12.0}, DType::Float64));
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = x64.to(dt), g = g64.to(dt);  // the values the kernels see, exactly widened below
    const Tensor xw = x.to(DType::Float64), gw = g.to(DType::Float64);
    Tensor want = empty_like(xw), got = empty_like(x);
    kernels::unary(kernels::Unary::GeluTanh, xw, want);
    kernels::unary(kernels::Unary::GeluTanh, x, got);
    const double allowed = dt == DType::Float32 ? 8 : 1;
    EXPECT_LE(max_ulps(got, want.to(dt), dt), allowed) << "forward";
    kernels::binary(kernels::Binary::GeluTanhGrad, gw, xw, want);
    kernels::binary(kernels::Binary::GeluTanhGrad, g, x, got);
    EXPECT_LE(max_ulps(got, want.to(dt), dt), allowed) << "backward";
  }
}

}  // namespace
}  // namespace castor
