// The optimizer step's multi-tensor pass in GB/s over GPT-2 124M's parameter shapes (AdamW, AdamW8bit, SGD with
// momentum), beside a STREAM-like copy bandwidth measured in the same run, and each step's process CPU time (what a
// loaded machine does not hide).
// Usage: optimizer_bench [reps (5)]. Bytes counted per element: AdamW reads w, g, m, v and writes w, m, v (28);
// AdamW8bit 16 on its 8-bit tensors (w, g read; w written; two codes read and written) and 28 on the rest; SGD with
// momentum reads w, g, buf and writes w, buf (20). The copy counts its read and its write (STREAM's convention).
// The fused step with a GradScaler and clipping (GradScaler::unscale_clip_ then step: one read pass over g for the
// norm and the inf check, the unscale and clip multiplied in the update) counts that read too (AdamW 32, AdamW8bit
// 20 / 32); the unfused calls (unscale_ in place, clip_grad_norm_, step) are timed for the same work, their
// gradients restored before each step outside the timing.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "bench_util.h"
#include "castor/grad_scaler.h"

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

// Parallel copies of `bytes` bytes between two buffers (each thread copying its chunks): the copy bandwidth counts
// the read and the write, as STREAM's.
class Copy {
 public:
  explicit Copy(size_t bytes) : a_(bytes, 1), b_(bytes, 0) {}
  double seconds() const {
    const size_t chunk = 1 << 20, bytes = a_.size(), chunks = (bytes + chunk - 1) / chunk;
    const char* a = a_.data();
    char* b = const_cast<char*>(b_.data());
    return bench::best_seconds(
        [&] {
#pragma omp parallel for schedule(static)
          for (size_t k = 0; k < chunks; ++k)
            std::memcpy(b + k * chunk, a + k * chunk, std::min(chunk, bytes - k * chunk));
        },
        1);
  }
  double bytes() const { return 2.0 * static_cast<double>(a_.size()); }

 private:
  std::vector<char> a_, b_;
};

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
  // On a loaded machine the copy and the steps are measured in turns, each its best of `reps`.
  const Copy copy(static_cast<size_t>(n) * 4);
  double copy_best = 1e30;
  Generator gen(1);
  std::vector<Tensor> params;
  for (const Shape& s : shapes) {
    params.push_back(randn(s, DType::Float32, &gen).requires_grad_());
    params.back().set_grad(mul(randn(s, DType::Float32, &gen), scalar_tensor(1e-3)));
  }
  const optim::AdamW8bitOptions eight_options;
  int64_t eight_bytes = 0;
  for (const Shape& s : shapes) eight_bytes += shape_numel(s) * (optim::AdamW8bit::is_8bit(s, eight_options) ? 16 : 28);
  std::vector<std::pair<const char*, double>> gbs;
  auto run = [&](const char* name, const std::function<void()>& step, double bytes,
                 const std::function<void()>& prepare = nullptr) {
    if (prepare) prepare();
    step();  // states allocated and touched
    double best = 1e30, cpu = 1e30;
    for (int r = 0; r < reps; ++r) {
      copy_best = std::min(copy_best, copy.seconds());
      if (prepare) prepare();
      const double c0 = bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = bench::clock_seconds(CLOCK_MONOTONIC);
      step();
      best = std::min(best, bench::clock_seconds(CLOCK_MONOTONIC) - w0);
      cpu = std::min(cpu, bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
    }
    gbs.emplace_back(name, bytes / best / 1e9);
    std::printf("%-28s %7.1f ms wall, %7.1f ms CPU (all threads, OpenMP waits included)\n", name, best * 1e3,
                cpu * 1e3);
  };
  {
    auto adamw = optim::make_adamw(params, optim::AdamOptions::adamw());
    run(
        "AdamW (32-bit states)", [&] { adamw->step(); }, 28.0 * static_cast<double>(n));
  }
  {  // the step before the one-pass change: a parallel region per tensor (an optimizer per tensor does that)
    std::vector<std::unique_ptr<optim::Adam>> each;
    for (const Tensor& p : params) each.push_back(optim::make_adamw({p}, optim::AdamOptions::adamw()));
    run(
        "AdamW, a region per tensor",
        [&] {
          for (auto& o : each) o->step();
        },
        28.0 * static_cast<double>(n));
  }
  {
    optim::AdamW8bit adamw8bit(params, eight_options);
    run(
        "AdamW8bit (block 2048)", [&] { adamw8bit.step(); }, static_cast<double>(eight_bytes));
  }
  {
    optim::SGD sgd(params, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    run(
        "SGD (momentum)", [&] { sgd.step(); }, 20.0 * static_cast<double>(n));
  }
  {  // the trainer's step at O1 float16: a GradScaler's unscale, the inf check and clipping with the update
    std::vector<Tensor> saved;
    for (const Tensor& p : params) saved.push_back(p.grad().clone());
    auto restore = [&] {
      for (size_t k = 0; k < params.size(); ++k) Tensor(params[k].grad()).copy_(saved[k]);
    };
    amp::GradScaler scaler(amp::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 1 << 30});
    const double max_norm = 0.01;  // below the gradients' norm: every step clips
    auto fused = [&](optim::Optimizer& opt) {
      scaler.unscale_clip_(opt, max_norm);
      scaler.step(opt);
      scaler.update();
    };
    auto unfused = [&](optim::Optimizer& opt) {
      scaler.unscale_(opt);
      amp::clip_grad_norm_(opt, max_norm);
      scaler.step(opt);
      scaler.update();
    };
    auto adamw = optim::make_adamw(params, optim::AdamOptions::adamw());
    run(
        "AdamW, fused scaler+clip", [&] { fused(*adamw); }, 32.0 * static_cast<double>(n));
    run(
        "AdamW, unscale_+clip+step", [&] { unfused(*adamw); }, 32.0 * static_cast<double>(n), restore);
    restore();
    optim::AdamW8bit adamw8bit(params, eight_options);
    run(
        "AdamW8bit, fused scaler+clip", [&] { fused(adamw8bit); }, static_cast<double>(eight_bytes + 4 * n));
  }
  const double copy_gbs = copy.bytes() / copy_best / 1e9;
  std::printf("%-28s %7.1f GB/s\n", "copy (STREAM-like)", copy_gbs);
  for (const auto& [name, g] : gbs) std::printf("%-28s %7.1f GB/s  %5.1f%% of copy\n", name, g, 100.0 * g / copy_gbs);
  return 0;
}
