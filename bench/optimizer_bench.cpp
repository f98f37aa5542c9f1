// The optimizer step's multi-tensor pass in GB/s over GPT-2 124M's parameter shapes (AdamW, AdamW8bit, SGD with
// momentum), beside a STREAM-like copy bandwidth measured in the same run.
// Usage: optimizer_bench [reps (5)]. Bytes counted per element: AdamW reads w, g, m, v and writes w, m, v (28);
// AdamW8bit 16 on its 8-bit tensors (w, g read; w written; two codes read and written) and 28 on the rest; SGD with
// momentum reads w, g, buf and writes w, buf (20). The copy counts its read and its write (STREAM's convention).
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench_util.h"

namespace castor {
namespace {

// GPT-2 124M's parameters (nanoGPT's, lm_head tied to wte): 124,475,904 elements in 148 tensors.
std::vector<Shape> gpt2_shapes() {
  const int64_t C = 768, V = 50304, T = 1024;
  std::vector<Shape> s = {{V, C}, {T, C}};
  for (int l = 0; l < 12; ++l) {
    for (const Shape& x :
         std::vector<Shape>{{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}})
      s.push_back(x);
  }
  s.push_back({C});
  s.push_back({C});
  return s;
}

// The best of `reps` parallel copies of `bytes` bytes, in GB/s (read + write).
double copy_bandwidth(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const size_t chunk = 1 << 20, chunks = (bytes + chunk - 1) / chunk;
  const double s = bench::best_seconds(
      [&] {
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < chunks; ++k)
          std::memcpy(b.data() + k * chunk, a.data() + k * chunk, std::min(chunk, bytes - k * chunk));
      },
      reps);
  return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

}  // namespace
}  // namespace castor

int main(int argc, char** argv) {
  using namespace castor;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::vector<Shape> shapes = gpt2_shapes();
  int64_t n = 0;
  for (const Shape& s : shapes) n += shape_numel(s);
  std::printf("CPU: %s; %d threads\n", bench::cpu_isa().c_str(), omp_get_max_threads());
  std::printf("GPT-2 124M shapes: %zu tensors, %lld elements; best of %d steps\n", shapes.size(),
              static_cast<long long>(n), reps);
  const double copy = copy_bandwidth(static_cast<size_t>(n) * 4, reps);
  std::printf("%-28s %8.1f GB/s\n", "copy (STREAM-like)", copy);
  Generator gen(1);
  std::vector<Tensor> params;
  for (const Shape& s : shapes) {
    params.push_back(randn(s, DType::Float32, &gen).requires_grad_());
    params.back().set_grad(mul(randn(s, DType::Float32, &gen), scalar_tensor(1e-3)));
  }
  const optim::AdamW8bitOptions eight_options;
  int64_t eight_bytes = 0;
  for (const Shape& s : shapes) eight_bytes += shape_numel(s) * (optim::AdamW8bit::is_8bit(s, eight_options) ? 16 : 28);
  auto run = [&](const char* name, optim::Optimizer& opt, double bytes) {
    const double s = bench::best_seconds([&] { opt.step(); }, reps);
    const double gbs = bytes / s / 1e9;
    std::printf("%-28s %8.1f GB/s  %7.1f ms  %5.1f%% of copy\n", name, gbs, s * 1e3, 100.0 * gbs / copy);
  };
  {
    auto adamw = optim::make_adamw(params, optim::AdamOptions::adamw());
    run("AdamW (32-bit states)", *adamw, 28.0 * static_cast<double>(n));
  }
  {
    optim::AdamW8bit adamw8bit(params, eight_options);
    run("AdamW8bit (block 2048)", adamw8bit, static_cast<double>(eight_bytes));
  }
  {
    optim::SGD sgd(params, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    run("SGD (momentum)", sgd, 20.0 * static_cast<double>(n));
  }
  return 0;
}
