// F::conv2d_max_pool2d_relu, whose forward runs convolution and pooling a slice of the batch at a time, against the
// three ops it stands for: values and every input gradient bit for bit, with a batch of several slices.
#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/random.h"
#include "autograd/node.h"
#include "test_util.h"

namespace castor {
namespace {

TEST(ConvPoolFusion, MatchesTheThreeOpsBitForBit) {
  // 150 images of 32 output channels at 32x32: 64 KiB of bf16 (128 KiB of float32) per image, so the fused forward
  // runs slices of 64 (32) images and a shorter last one.
  Generator gen(5);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64})
    for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << (format == MemoryFormat::ChannelsLast ? " nhwc" : " nchw"));
      const int64_t n = dt == DType::Float64 ? 3 : 150;  // float64: the reference loops, slow
      const Tensor x0 = randn({n, 3, 32, 32}, DType::Float32, &gen).to(dt).contiguous(format);
      const Tensor w0 = randn({32, 3, 3, 3}, DType::Float32, &gen).to(dt);
      const Tensor b0 = randn({32}, DType::Float32, &gen).to(dt);
      const Tensor gy = randn({n, 32, 16, 16}, DType::Float32, &gen).to(dt).contiguous(format);
      Tensor xa = x0.clone().requires_grad_(), wa = w0.clone().requires_grad_(), ba = b0.clone().requires_grad_();
      Tensor xb = x0.clone().requires_grad_(), wb = w0.clone().requires_grad_(), bb = b0.clone().requires_grad_();
      const Tensor ya = F::conv2d_max_pool2d_relu(xa, wa, ba, {1, 1}, {1, 1}, {2, 2});
      const Tensor yb = F::relu(F::max_pool2d(F::conv2d(xb, wb, bb, {1, 1}, {1, 1}), {2, 2}));
      ASSERT_EQ(ya.shape(), yb.shape());
      // One fused node on channels-last float32 and 16-bit inputs; the three ops' nodes elsewhere.
      const bool fused = format == MemoryFormat::ChannelsLast && dt != DType::Float64;
      EXPECT_EQ(ya.grad_fn()->op == OpKind::Conv2dMaxPool2dRelu, fused);
      EXPECT_TRUE(test::bit_equal(ya, yb));
      backward({ya}, {gy});
      backward({yb}, {gy});
      EXPECT_TRUE(test::bit_equal(xa.grad(), xb.grad()));
      EXPECT_TRUE(test::bit_equal(wa.grad(), wb.grad()));
      EXPECT_TRUE(test::bit_equal(ba.grad(), bb.grad()));
    }
}

TEST(ConvPoolFusion, OneChannelInputsRunFusedAndChannelsLast) {
  // A (N, 1, H, W) batch is laid out alike in both formats (Fashion-MNIST's): SimpleCNN's first layer fuses it and
  // hands the layers after it a channels-last output.
  Generator gen(6);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = randn({70, 1, 28, 28}, DType::Float32, &gen).to(dt);
    const Tensor w0 = randn({32, 1, 3, 3}, DType::Float32, &gen).to(dt), b0 = randn({32}, DType::Float32, &gen).to(dt);
    const Tensor gy = randn({70, 32, 14, 14}, DType::Float32, &gen).to(dt).contiguous(MemoryFormat::ChannelsLast);
    Tensor wa = w0.clone().requires_grad_(), ba = b0.clone().requires_grad_();
    Tensor wb = w0.clone().requires_grad_(), bb = b0.clone().requires_grad_();
    const Tensor ya = F::conv2d_max_pool2d_relu(x0, wa, ba, {1, 1}, {1, 1}, {2, 2});
    const Tensor yb = F::relu(F::max_pool2d(F::conv2d(x0, wb, bb, {1, 1}, {1, 1}), {2, 2}));
    EXPECT_EQ(ya.grad_fn()->op, OpKind::Conv2dMaxPool2dRelu);
    EXPECT_EQ(ya.suggest_memory_format(), MemoryFormat::ChannelsLast);
    EXPECT_TRUE(test::bit_equal(ya, yb));
    backward({ya}, {gy});
    backward({yb}, {gy});
    EXPECT_TRUE(test::bit_equal(wa.grad(), wb.grad()));
    EXPECT_TRUE(test::bit_equal(ba.grad(), bb.grad()));
  }
}

TEST(ConvPoolFusion, BadOperandsNameTheOp) {
  const Tensor x = randn({2, 3, 8, 8}), w = randn({4, 5, 3, 3});
  test::expect_error(
      [&] {
        F::conv2d_max_pool2d_relu(x, w, Tensor(), {1, 1}, {1, 1}, {2, 2});
      },
      {"conv2d_max_pool2d_relu"});
}

}  // namespace
}  // namespace castor
