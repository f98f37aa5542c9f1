// The 16-bit GEMM emulation (float16, and bfloat16 without bf16 dot-product units) against float32 on the default GPT
// job's linear layers (issue #33): each layer's forward, input-gradient and weight-gradient products through
// kernels::matmul, float32 / bfloat16 / float16 calls interleaved, median process CPU time and wall time per call.
// Run it with OMP_WAIT_POLICY=passive (idle threads then cost no CPU time) and, to emulate an AVX2-only CPU,
// ONEDNN_MAX_CPU_ISA=AVX2.
//
//   emulation_bench [REPS=200]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "castor/backends.h"
#include "kernels/kernels.h"

using namespace castor;

namespace {

struct Times {
  double cpu, wall;
};

template <class F>
Times timed(const F& fn) {
  const double c0 = bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = bench::clock_seconds(CLOCK_MONOTONIC);
  fn();
  return {bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0, bench::clock_seconds(CLOCK_MONOTONIC) - w0};
}

// One product of a linear layer x (M, K) with weight W (N, K): "fwd" x W^T, "dx" dY W, "dw" dY^T x.
struct Product {
  const char* name;
  int64_t M, K, N;
};

// The operands of `kind` in `dt`: a and b as the autograd of F.linear passes them (transposed views, not copies).
void operands(const Product& p, const char* kind, DType dt, Tensor& a, Tensor& b, Tensor& c) {
  const Tensor x = randn({p.M, p.K}).to(dt), w = randn({p.N, p.K}).to(dt), dy = randn({p.M, p.N}).to(dt);
  const std::string k = kind;
  if (k == "fwd") a = x, b = w.t(), c = empty({p.M, p.N}, dt);
  if (k == "dx") a = dy, b = w, c = empty({p.M, p.K}, dt);
  if (k == "dw") a = dy.t(), b = x, c = empty({p.N, p.K}, dt);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  std::printf("# %s; bf16 dot units: %s; %d reps, dtypes interleaved, medians\n", bench::cpu_isa().c_str(),
              backends::bf16_dot_units() ? backends::bf16_dot_units() : "none", reps);
  // The default GPT job: batch 12 x block 64 tokens, 128 wide, 4x MLP, 65-character vocabulary.
  const std::vector<Product> layers = {{"c_attn", 768, 128, 384},
                                       {"c_proj", 768, 128, 128},
                                       {"c_fc", 768, 128, 512},
                                       {"mlp_proj", 768, 512, 128},
                                       {"lm_head", 768, 128, 65}};
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  std::printf("%-9s %-4s %12s %12s %12s   %8s %8s   %8s %8s\n", "layer", "pass", "f32 cpu us", "bf16 cpu us",
              "f16 cpu us", "bf16/f32", "f16/f32", "wall bf16", "wall f16");
  double total_cpu[3] = {0, 0, 0}, total_wall[3] = {0, 0, 0};
  for (const Product& p : layers)
    for (const char* kind : {"fwd", "dx", "dw"}) {
      Tensor a[3], b[3], c[3];
      std::vector<double> cpu[3], wall[3];
      for (int d = 0; d < 3; ++d) operands(p, kind, dtypes[d], a[d], b[d], c[d]);
      for (int r = 0; r < reps + 3; ++r)
        for (int d = 0; d < 3; ++d) {
          const Times t = timed([&] { kernels::matmul(a[d], b[d], c[d]); });
          if (r >= 3) cpu[d].push_back(t.cpu), wall[d].push_back(t.wall);
        }
      double mc[3], mw[3];
      for (int d = 0; d < 3; ++d) {
        mc[d] = bench::median(cpu[d]), mw[d] = bench::median(wall[d]);
        total_cpu[d] += mc[d], total_wall[d] += mw[d];
      }
      std::printf("%-9s %-4s %12.1f %12.1f %12.1f   %7.2fx %7.2fx   %7.2fx %7.2fx\n", p.name, kind, 1e6 * mc[0],
                  1e6 * mc[1], 1e6 * mc[2], mc[1] / mc[0], mc[2] / mc[0], mw[1] / mw[0], mw[2] / mw[0]);
    }
  std::printf("%-14s %12.1f %12.1f %12.1f   %7.2fx %7.2fx   %7.2fx %7.2fx   (time over float32's)\n", "all",
              1e6 * total_cpu[0], 1e6 * total_cpu[1], 1e6 * total_cpu[2], total_cpu[1] / total_cpu[0],
              total_cpu[2] / total_cpu[0], total_wall[1] / total_wall[0], total_wall[2] / total_wall[0]);
  return 0;
}
