// The float32 emulation of 16-bit convolutions (float16 here; bfloat16 without oneDNN bf16 kernels), which runs the
// batch in slices: values and gradients against float64 on the same 16-bit inputs, with a batch of several slices.
#include <gtest/gtest.h>

#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

TEST(ConvEmulation, SlicedBatchMatchesFloat64) {
  // 70 images of 32 output channels at 32x32: 128 KiB of float32 per image, so eight slices of 8 images and one of 6.
  Generator gen(11);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
    const Tensor x0 = randn({70, 3, 32, 32}, DType::Float32, &gen).to(DType::Float16).contiguous(format);
    const Tensor w0 = randn({32, 3, 3, 3}, DType::Float32, &gen).to(DType::Float16);
    const Tensor b0 = randn({32}, DType::Float32, &gen).to(DType::Float16);
    const Tensor gy = randn({70, 32, 32, 32}, DType::Float32, &gen).to(DType::Float16).contiguous(format);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Tensor x64 = x0.double_().requires_grad_(), w64 = w0.double_().requires_grad_(), b64 = b0.double_().requires_grad_();
    const Tensor y = F::conv2d(x, w, b, {1, 1}, {1, 1});
    const Tensor y64 = F::conv2d(x64, w64, b64, {1, 1}, {1, 1});
    // One rounding to float16 of a float32 sum of 27 products: within an ulp of float16 (2^-10 relative).
    EXPECT_TRUE(test::close(y, y64, 2e-3, 1e-3));
    backward({y}, {gy});
    backward({y64}, {gy.double_()});
    EXPECT_TRUE(test::close(x.grad(), x64.grad(), 2e-3, 1e-2));
    // Sums over 70 * 32 * 32 products, in float32 per slice and then across slices.
    EXPECT_TRUE(test::close(w.grad(), w64.grad(), 2e-3, 0.5));
    EXPECT_TRUE(test::close(b.grad(), b64.grad(), 2e-3, 0.5));
  }
}

}  // namespace
}  // namespace castor
