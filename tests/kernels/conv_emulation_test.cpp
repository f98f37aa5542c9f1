// The float32 emulation of 16-bit convolutions (float16 here; bfloat16 without oneDNN bf16 kernels), which runs the
// batch in slices: values and gradients against float64 on the same 16-bit inputs, with a batch of several slices.
// Also the bfloat16 backward-weights pass that runs in slices when its primitive takes reordered activations.
#include <gtest/gtest.h>

#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/random.h"
#include "test_util.h"

namespace castor {
namespace {

TEST(ConvEmulation, SlicedBatchMatchesFloat64) {
  // 70 images of 32 output channels at 32x32: 128 KiB of float32 per image, so two slices of 32 images and one of 6.
  Generator gen(11);
  for (MemoryFormat format : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
    const Tensor x0 = randn({70, 3, 32, 32}, DType::Float32, &gen).to(DType::Float16).contiguous(format);
    const Tensor w0 = randn({32, 3, 3, 3}, DType::Float32, &gen).to(DType::Float16);
    const Tensor b0 = randn({32}, DType::Float32, &gen).to(DType::Float16);
    const Tensor gy = randn({70, 32, 32, 32}, DType::Float32, &gen).to(DType::Float16).contiguous(format);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Tensor x64 = x0.double_().requires_grad_(), w64 = w0.double_().requires_grad_(),
           b64 = b0.double_().requires_grad_();
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

// A first layer's bfloat16 backward-weights pass: where its primitive takes diff_dst in a blocked layout (AVX512_BF16
// without AMX: the IsaCap.AVX512_CORE_BF16 run) the batch is done in slices whose reordered copies stay near 4 MiB,
// summed in float32; elsewhere (AMX, emulation) in one pass. Either way the gradients are float32 sums rounded once
// and the pass holds less than another diff_dst's worth of scratch (a whole-batch reorder would hold 15 MiB; the
// emulation's float32 slices of 4 MiB, with their widened inputs, about 9 MiB).
TEST(ConvEmulation, BFloat16WeightGradientsOfReorderedBatchesInSlices) {
  Generator gen(12);
  const int64_t n = 240;  // 64 KiB of bfloat16 diff_dst per image: 15 MiB, four slices
  const auto cl = MemoryFormat::ChannelsLast;
  const Tensor x0 = randn({n, 3, 32, 32}, DType::Float32, &gen).to(DType::BFloat16).contiguous(cl);
  const Tensor w0 = randn({32, 3, 3, 3}, DType::Float32, &gen).to(DType::BFloat16);
  const Tensor b0 = randn({32}, DType::Float32, &gen).to(DType::BFloat16);
  const Tensor gy = randn({n, 32, 32, 32}, DType::Float32, &gen).to(DType::BFloat16).contiguous(cl);
  Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  Tensor w64 = w0.double_().requires_grad_(), b64 = b0.double_().requires_grad_();
  const Tensor y = F::conv2d(x0, w, b, {1, 1}, {1, 1}), y64 = F::conv2d(x0.double_(), w64, b64, {1, 1}, {1, 1});
  reset_peak_memory_stats();
  const int64_t before = memory_stats().current_bytes;
  backward({y}, {gy});
  EXPECT_LT(memory_stats().peak_bytes - before, gy.numel() * 2) << "the backward held a whole-batch copy";
  backward({y64}, {gy.double_()});
  // Sums over 240 * 32 * 32 products: within a bfloat16 ulp (2^-8 relative) of float64's.
  EXPECT_TRUE(test::close(w.grad(), w64.grad(), 8e-3, 1.0));
  EXPECT_TRUE(test::close(b.grad(), b64.grad(), 8e-3, 1.0));
}

}  // namespace
}  // namespace castor
