// The fast channels-last max pooling kernel against the reference loops, bit for bit in every dtype: ties, signed
// zeros, infinities and NaNs, padded, overlapping and gapped windows, odd channel counts.
#include <array>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/layers.h"
#include "test_util.h"

namespace castor {
namespace {

// (N, C, H, W) channels-last values of `dt` drawn from a few integers (many ties within a window), with signed
// zeros, infinities and NaNs sprinkled in when `specials`.
Tensor tied_values(const Shape& shape, DType dt, uint64_t seed, bool specials) {
  Generator gen(seed);
  std::vector<double> v = randint(-3, 4, shape, &gen).to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  const double special[] = {0.0, -0.0, inf, -inf, std::nan("")};
  if (specials)
    for (size_t i = 0; i < v.size(); i += 7) v[i] = special[(i / 7) % 5];
  return tensor(v, shape, DType::Float64).to(dt).contiguous(MemoryFormat::ChannelsLast);
}

struct Case {
  int64_t c, h, w, kernel[2], stride[2], padding[2];
};

kernels::Pool2dParams params(const Case& k) {
  kernels::Pool2dParams p{};
  p.is_max = true;
  for (int i = 0; i < 2; ++i) p.kernel[i] = k.kernel[i], p.stride[i] = k.stride[i], p.padding[i] = k.padding[i];
  return p;
}

int64_t out_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

TEST(MaxPoolNhwc, FastMatchesReferenceBitForBit) {
  const Case cases[] = {
      {32, 8, 8, {2, 2}, {2, 2}, {0, 0}},    // SimpleCNN's pooling: disjoint windows
      {67, 7, 9, {2, 2}, {2, 2}, {0, 0}},    // odd sizes: the last row and column belong to no window
      {5, 9, 7, {3, 3}, {2, 2}, {1, 1}},     // overlapping, padded (ResNet's stem pooling)
      {3, 6, 7, {3, 2}, {3, 2}, {1, 1}},     // disjoint, padded
      {17, 10, 11, {2, 3}, {3, 4}, {1, 0}},  // gaps between windows
      {16, 5, 6, {3, 3}, {1, 1}, {1, 1}},    // stride 1
  };
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    for (bool specials : {false, true})
      for (const Case& k : cases) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " specials " << specials << " c " << k.c << " " << k.h
                                        << "x" << k.w << " kernel " << k.kernel[0] << "x" << k.kernel[1] << " stride "
                                        << k.stride[0] << "x" << k.stride[1] << " padding " << k.padding[0] << "x"
                                        << k.padding[1]);
        const kernels::Pool2dParams p = params(k);
        const int64_t n = 3, oh = out_size(k.h, k.kernel[0], k.stride[0], k.padding[0]),
                      ow = out_size(k.w, k.kernel[1], k.stride[1], k.padding[1]);
        const Tensor src = tied_values({n, k.c, k.h, k.w}, dt, 1, specials);
        const Tensor diff_dst = tied_values({n, k.c, oh, ow}, dt, 2, specials);
        Tensor dst = empty({n, k.c, oh, ow}, dt, MemoryFormat::ChannelsLast), dst_ref = empty_like(dst);
        const Tensor ws = kernels::max_pool2d_nhwc_forward(src, dst, p);
        const Tensor ws_ref = kernels::max_pool2d_nhwc_forward_ref(src, dst_ref, p);
        EXPECT_EQ(ws.dtype(), DType::UInt8);
        EXPECT_TRUE(test::bit_equal(dst, dst_ref));
        Tensor diff_src = empty({n, k.c, k.h, k.w}, dt, MemoryFormat::ChannelsLast),
               diff_src_ref = empty_like(diff_src);
        kernels::max_pool2d_nhwc_backward(diff_dst, ws, diff_src, p);
        kernels::max_pool2d_nhwc_backward_ref(diff_dst, ws_ref, diff_src_ref);
        EXPECT_TRUE(test::bit_equal(diff_src, diff_src_ref));
        // And the float64 NCHW loops, the oracle of the layer kernels, agree on the values.
        Tensor dst64 = empty({n, k.c, oh, ow}, DType::Float64);
        kernels::pool2d_forward_ref(src.to(DType::Float64).contiguous(), dst64, p);
        EXPECT_TRUE(test::bit_equal(dst.to(DType::Float64).contiguous(), dst64));
      }
}

TEST(MaxPoolNhwc, SignedZerosAndFirstMaximum) {
  // Hand-worked: one 2x2 window per channel. Channel 0: -0 then +0, equal, so the first (-0) stays; channel 1: NaN
  // in the second position beats 5; channel 2: two NaNs, the first wins (its gradient goes there). A -0 gradient
  // comes back as +0, as PyTorch's zero-filled sum gives it.
  const double nan = std::nan("");
  // (N=1, H=2, W=2, C=3) values, laid out channels-last.
  const std::vector<double> nhwc = {-0.0, 5, nan, 0.0, nan, 1, 0.0, 1, nan, 0.0, 2, 3};
  const Tensor src = tensor(nhwc, {1, 2, 2, 3}, DType::Float64).to(DType::BFloat16).permute({0, 3, 1, 2});
  ASSERT_EQ(src.suggest_memory_format(), MemoryFormat::ChannelsLast);
  kernels::Pool2dParams p{};
  p.is_max = true;
  p.kernel[0] = p.kernel[1] = p.stride[0] = p.stride[1] = 2;
  Tensor dst = empty({1, 3, 1, 1}, DType::BFloat16, MemoryFormat::ChannelsLast);
  const Tensor ws = kernels::max_pool2d_nhwc_forward(src, dst, p);
  const auto y = dst.to_vector<double>();
  EXPECT_TRUE(y[0] == 0.0 && std::signbit(y[0]));
  EXPECT_TRUE(std::isnan(y[1]) && std::isnan(y[2]));
  EXPECT_EQ(ws.to_vector<double>(), (std::vector<double>{0, 1, 0}));
  const Tensor diff_dst = tensor(std::vector<double>{-0.0, 4.0, 8.0}, {1, 3, 1, 1}, DType::Float64).to(DType::BFloat16);
  Tensor diff_src = empty({1, 3, 2, 2}, DType::BFloat16, MemoryFormat::ChannelsLast);
  kernels::max_pool2d_nhwc_backward(diff_dst.contiguous(MemoryFormat::ChannelsLast), ws, diff_src, p);
  const auto dx = diff_src.permute({0, 2, 3, 1}).contiguous().to_vector<double>();  // (N, H, W, C)
  EXPECT_EQ(dx, (std::vector<double>{0, 0, 8, 0, 4, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_FALSE(std::signbit(dx[0]));
}

TEST(MaxPoolNhwc, LayerKernelPicksTheFastKernelUpTo256WindowPositions) {
  Generator gen(3);
  const Tensor x = randn({2, 4, 17, 17}, DType::Float32, &gen).contiguous(MemoryFormat::ChannelsLast);
  kernels::Pool2dParams p{};
  p.is_max = true;
  p.kernel[0] = p.kernel[1] = p.stride[0] = p.stride[1] = 16;
  Tensor y = empty({2, 4, 1, 1}, DType::Float32, MemoryFormat::ChannelsLast);
  EXPECT_EQ(kernels::pool2d_forward(x, y, p).dtype(), DType::UInt8);
  p.kernel[0] = p.kernel[1] = p.stride[0] = p.stride[1] = 17;  // 289 positions: the reference loops' int32 argmax
  EXPECT_EQ(kernels::pool2d_forward(x, y, p).dtype(), DType::Int32);
  // Both backward paths take their own workspace through the layer kernel.
  const Tensor dy = ones({2, 4, 1, 1}, DType::Float32).contiguous(MemoryFormat::ChannelsLast);
  Tensor dx = empty({2, 4, 17, 17}, DType::Float32, MemoryFormat::ChannelsLast);
  kernels::pool2d_backward(dy, kernels::pool2d_forward(x, y, p), dx, p);
  EXPECT_DOUBLE_EQ(sum(dx).item(), 8.0);
}

}  // namespace
}  // namespace castor

namespace castor {
namespace {

// max_pool2d_relu against relu(max_pool2d(x)), values and input gradients bit for bit: folded on channels-last
// float32 and 16-bit inputs, the two ops elsewhere (NCHW, float64).
TEST(MaxPoolRelu, FoldedMatchesTheTwoOpsBitForBit) {
  struct Pool {
    std::array<int64_t, 2> kernel, stride, padding;
  };
  // The last: 256 positions, one too many for the folded kernel's workspace, so the two ops run.
  const Pool pools[] = {{{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {2, 2}, {1, 1}}, {{16, 16}, {16, 16}, {0, 0}}};
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64})
    for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous})
      for (const Pool& pool : pools) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << (format == MemoryFormat::ChannelsLast ? " nhwc" : " nchw")
                                        << " kernel " << pool.kernel[0]);
        // Signed zeros, infinities and NaNs included: the ReLU's treatment of each must survive the folding.
        const Shape shape = pool.kernel[0] == 16 ? Shape{2, 5, 17, 16} : Shape{2, 37, 7, 8};
        const Tensor x0 = tied_values(shape, dt, 5, /*specials=*/true).contiguous(format);
        Tensor a = x0.clone().requires_grad_(), b = x0.clone().requires_grad_();
        const Tensor ya = F::max_pool2d_relu(a, pool.kernel, pool.stride, pool.padding);
        const Tensor yb = F::relu(F::max_pool2d(b, pool.kernel, pool.stride, pool.padding));
        EXPECT_TRUE(test::bit_equal(ya, yb));
        const Tensor dy = tied_values(ya.shape(), dt, 6, /*specials=*/true).contiguous(format);
        backward({ya}, {dy});
        backward({yb}, {dy});
        EXPECT_TRUE(test::bit_equal(a.grad(), b.grad()));
      }
}

}  // namespace
}  // namespace castor
