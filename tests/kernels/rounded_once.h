// A check shared by the 16-bit matrix-product tests: a product rounded once from a float32 sum.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "castor/tensor.h"

namespace castor::test {

// Every element of `got` (16-bit) is within one 16-bit ulp, plus float32's accumulation error (bounded by
// 2^-20 of `magnitude`, the sum of the products' magnitudes), of the float64 `exact` rounded to its dtype, and at least
// 99% are that correctly rounded value: two roundings (a 16-bit partial sum per tile) would miss the second bound.
inline void expect_rounded_once(const Tensor& got, const Tensor& exact, const Tensor& magnitude) {
  ASSERT_EQ(got.shape(), exact.shape());
  const std::vector<double> g = got.to_vector<double>(), r = exact.to(got.dtype()).to_vector<double>(),
                            e = exact.to_vector<double>(), m = magnitude.to_vector<double>();
  const double ulp = got.dtype() == DType::BFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  int64_t correctly_rounded = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    correctly_rounded += g[i] == r[i];
    const double spacing = ulp * std::exp2(std::floor(std::log2(std::max(std::abs(e[i]), 1e-30))));
    ASSERT_LE(std::abs(g[i] - r[i]), spacing + std::ldexp(m[i], -20))
        << "element " << i << ": " << g[i] << " vs " << r[i];
  }
  EXPECT_GE(correctly_rounded, static_cast<int64_t>(0.99 * static_cast<double>(g.size())))
      << correctly_rounded << " of " << g.size() << " correctly rounded";
}

}  // namespace castor::test
