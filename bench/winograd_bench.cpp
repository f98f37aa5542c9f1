// ResNet-18's 3x3 body convolutions (CIFAR form, batch 64) through F::conv2d, forward and backward, in float32 run
// direct and as Winograd (castor/backends.h) and in bfloat16 (direct; oneDNN has no bfloat16 Winograd): the speed
// behind `castor train --conv-algorithm auto`. Channels-last activations, as the models use.
//
// Usage: winograd_bench [reps]   (default 5; prints the CPU, then per layer the median milliseconds of forward and
// of backward (data + weights) and the direct/Winograd ratio)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "castor/autograd.h"
#include "castor/backends.h"
#include "castor/functional.h"
#include "castor/random.h"

namespace {

using namespace castor;
using Clock = std::chrono::steady_clock;

struct Times {
  double forward_ms, backward_ms;
};

// Median forward and backward times of one convolution (channels c -> c, h x h, 3x3, padding 1) in `dt`.
Times time_conv(int64_t c, int64_t h, DType dt, int reps) {
  Generator gen(1);
  const Tensor x =
      randn({64, c, h, h}, DType::Float32, &gen).to(dt).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
  const Tensor w = (randn({c, c, 3, 3}, DType::Float32, &gen) * 0.05).to(dt).requires_grad_();
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    const Tensor y = F::conv2d(x, w, {}, {1, 1}, {1, 1});
    const auto t1 = Clock::now();
    backward({y}, {ones_like(y)});
    const auto t2 = Clock::now();
    if (r == 0) continue;  // warm-up: primitive creation, first-touch pages
    fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  return {fwd[fwd.size() / 2], bwd[bwd.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::printf("CPU: %s; batch 64, channels-last, median of %d\n", bench::cpu_isa().c_str(), reps);
  std::printf("%-16s %22s %22s %22s %9s\n", "layer", "fp32 direct fwd/bwd", "fp32 Winograd fwd/bwd",
              "bf16 direct fwd/bwd", "direct/W");
  double sum[3] = {0, 0, 0};
  for (const auto& [c, h] : {std::pair<int64_t, int64_t>{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
    backends::set_conv_algorithm(backends::ConvAlgorithm::Direct);
    const Times direct = time_conv(c, h, DType::Float32, reps);
    backends::set_conv_algorithm(backends::ConvAlgorithm::Auto);
    const Times winograd = time_conv(c, h, DType::Float32, reps);
    const Times bf16 = time_conv(c, h, DType::BFloat16, reps);
    const double d = direct.forward_ms + direct.backward_ms, wi = winograd.forward_ms + winograd.backward_ms;
    sum[0] += d, sum[1] += wi, sum[2] += bf16.forward_ms + bf16.backward_ms;
    std::printf("%4lld ch %2lldx%-2lld    %9.1f / %7.1f ms %9.1f / %7.1f ms %9.1f / %7.1f ms %8.2fx\n",
                static_cast<long long>(c), static_cast<long long>(h), static_cast<long long>(h), direct.forward_ms,
                direct.backward_ms, winograd.forward_ms, winograd.backward_ms, bf16.forward_ms, bf16.backward_ms,
                d / wi);
  }
  std::printf("%-16s %19.1f ms %19.1f ms %19.1f ms %8.2fx\n", "sum", sum[0], sum[1], sum[2], sum[0] / sum[1]);
  return 0;
}
