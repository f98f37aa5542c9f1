// AMP training steps of SimpleCNN (3x32x32, batch 256, Adam, as issue #11 measures): Castor O0 float32 and O1/O2/O3 bfloat16
// side by side, the AMP overhead inside the O1 step, peak step memory, and PyTorch 1.13 CPU (float32 and
// torch.autocast bfloat16, each in NCHW and channels_last) on the same model and batch, run from here as
// /usr/bin/python3 bench/amp_torch_bench.py in PyTorch's best configuration (bench::torch_command: tcmalloc);
// prints the CPU and its ISA.
//
// Usage: amp_bench [reps] [torch_reps]   (torch_reps 0: Castor alone). Configurations alternate step by step after
// two warm-up steps each; each figure is the median of `reps` steps. Where oneDNN has no bfloat16 kernels (CPUs
// without AVX-512, or ONEDNN_MAX_CPU_ISA=AVX2), Castor's bfloat16 convolutions and matmuls run on float32 copies, and
// so do PyTorch's.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "castor/allocator.h"
#include "castor/amp.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/random.h"
#include "runtime/dispatch.h"
#include "bench_util.h"

namespace {

using namespace castor;

constexpr int64_t kBatch = 256;

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One Castor configuration: its own SimpleCNN (same initial weights), Adam and Amp.
struct Config {
  std::string name;
  std::shared_ptr<models::SimpleCNN> model;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<amp::Amp> amp;
  std::vector<double> seconds;

  Config(std::string label, amp::OptLevel level, DType dtype, const amp::Overrides& ov) : name(std::move(label)) {
    manual_seed(0);
    model = models::simple_cnn(3, 32, 32);
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
    amp = amp::initialize(*model, {opt.get()}, level, dtype, ov);
  }

  // One training step on a float32 batch. `unscale_seconds`, when given, receives the time of the explicit
  // fused unscale-and-check pass.
  void step(const Tensor& x, const Tensor& y, double* unscale_seconds = nullptr) {
    Tensor loss;
    {
      auto fw = amp->forward();
      loss = F::cross_entropy((*model)(x), y);  // O2/O3: the model casts x in and its logits out (Apex)
    }
    amp->scale_loss(loss, *opt).backward();
    if (unscale_seconds) *unscale_seconds += seconds_of([&] { amp->unscale_(*opt); });
    amp->step(*opt);
    opt->zero_grad();
  }
};

// Sums the time autocast spends casting op inputs in the forward pass (cache lookups included). The casts of
// gradients back to float32 happen inside the autograd engine and are not seen here.
struct CastTimer : OpObserver {
  double forward_cast = 0;
  void on_op(const OpEvent& e) override { forward_cast += e.autocast_seconds; }
};

struct TorchResult {
  std::map<std::string, double> images_per_s;
  std::string threads;
};

TorchResult run_torch(int reps, int threads) {
  const std::string cmd = bench::torch_command("amp_torch_bench.py " + std::to_string(reps) + " " +
                                               std::to_string(kBatch) + " " + std::to_string(threads));
  TorchResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char key[64];
  double v;
  while (std::fscanf(p, "%63s %lf", key, &v) == 2) {
    if (std::string(key) == "threads")
      r.threads = std::to_string(static_cast<int>(v));
    else
      r.images_per_s[key] = v;
  }
  if (pclose(p) != 0) std::fprintf(stderr, "amp_bench: %s failed\n", cmd.c_str());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int torch_reps = argc > 2 ? std::atoi(argv[2]) : 3;
  Generator gen(1);
  const Tensor x = randn({kBatch, 3, 32, 32}, DType::Float32, &gen), y = randint(0, 10, {kBatch}, &gen);

  using amp::OptLevel;
  std::vector<std::unique_ptr<Config>> configs;
  // O0 ignores the 16-bit type: everything stays float32.
  configs.push_back(std::make_unique<Config>("O0 float32", OptLevel::O0, DType::BFloat16, amp::Overrides{}));
  configs.push_back(std::make_unique<Config>("O1 bf16", OptLevel::O1, DType::BFloat16, amp::Overrides{}));
  configs.push_back(std::make_unique<Config>("O2 bf16", OptLevel::O2, DType::BFloat16, amp::Overrides{}));
  configs.push_back(std::make_unique<Config>("O3 bf16", OptLevel::O3, DType::BFloat16, amp::Overrides{}));
  configs.push_back(std::make_unique<Config>("O1 bf16 + loss scale 2^16", OptLevel::O1, DType::BFloat16,
                                             amp::Overrides{.loss_scale = 65536.0}));
  for (auto& c : configs) {
    c->step(x, y);
    c->step(x, y);
  }
  for (int r = 0; r < reps; ++r)
    for (auto& c : configs) c->seconds.push_back(seconds_of([&] { c->step(x, y); }));

  const int threads = omp_get_max_threads();
  std::printf("CPU: %s\n", bench::cpu_isa().c_str());
  std::printf("SimpleCNN training step, batch %lld, %d OpenMP threads, median of %d alternating steps\n",
              static_cast<long long>(kBatch), threads, reps);
  const double base = bench::median(configs[0]->seconds);
  std::map<std::string, double> castor_ips;
  for (auto& c : configs) {
    const double s = bench::median(c->seconds);
    castor_ips[c->name] = kBatch / s;
    std::printf("  castor %-26s %8.1f images/s  %7.1f ms/step  %5.2fx vs O0\n", c->name.c_str(), kBatch / s, 1e3 * s,
                base / s);
  }

  // The AMP overhead inside the O1 step with loss scaling on: autocast's casts and cache (forward) and the fused
  // unscale-and-check pass.
  Config& o1s = *configs[4];
  CastTimer timer;
  double unscale = 0, total = 0;
  set_op_observer(&timer);
  for (int r = 0; r < reps; ++r) total += seconds_of([&] { o1s.step(x, y, &unscale); });
  set_op_observer(nullptr);
  const auto cache = amp::cast_cache_stats();
  std::printf("AMP overhead in the %s step (%d steps, observed): %.1f ms/step total\n", o1s.name.c_str(), reps,
              1e3 * total / reps);
  std::printf("  autocast input casts + cache (forward) %6.2f ms  %5.1f%%\n", 1e3 * timer.forward_cast / reps,
              100 * timer.forward_cast / total);
  std::printf("  fused unscale + inf/NaN check          %6.2f ms  %5.1f%%\n", 1e3 * unscale / reps,
              100 * unscale / total);
  std::printf("  cast cache so far: %lld hits, %lld misses\n", static_cast<long long>(cache.hits),
              static_cast<long long>(cache.misses));
  std::printf("  O1 bf16 step with loss scaling minus without (medians): %+.1f ms\n",
              1e3 * (bench::median(o1s.seconds) - bench::median(configs[1]->seconds)));

  // Peak memory of one step above what is resident before it (models, optimizer state, the batch).
  for (int k : {0, 1}) {
    const int64_t resident = memory_stats().current_bytes;
    reset_peak_memory_stats();
    configs[k]->step(x, y);
    const int64_t peak = memory_stats().peak_bytes;
    std::printf("peak memory %-12s step: %7.1f MiB (%.1f MiB above the %.1f MiB resident)\n", configs[k]->name.c_str(),
                peak / 1048576.0, (peak - resident) / 1048576.0, resident / 1048576.0);
  }

  if (torch_reps <= 0) return 0;  // Castor alone (under ONEDNN_MAX_CPU_ISA=AVX2 PyTorch's bf16 convolutions fail)
  const TorchResult torch = run_torch(torch_reps, threads);
  std::printf("PyTorch 1.13 CPU, same model and batch, %s threads, %s, median of %d alternating steps\n",
              torch.threads.c_str(), bench::torch_allocator(), torch_reps);
  for (const auto& [mode, ips] : torch.images_per_s) std::printf("  torch  %-26s %8.1f images/s\n", mode.c_str(), ips);
  // Against each PyTorch configuration, and its best layout (channels_last here, NCHW on some CPUs).
  auto versus = [&](const char* label, const std::string& castor_name, const std::string& mode) {
    const auto& t = torch.images_per_s;
    if (!t.count(mode) || !t.count(mode + "_cl")) return;
    const double best = std::max(t.at(mode), t.at(mode + "_cl"));
    std::printf("castor / torch %-15s NCHW %.2fx, channels_last %.2fx, best layout %.2fx\n", label,
                castor_ips[castor_name] / t.at(mode), castor_ips[castor_name] / t.at(mode + "_cl"),
                castor_ips[castor_name] / best);
  };
  versus("float32 (O0)", "O0 float32", "float32");
  versus("bf16 (O1)", "O1 bf16", "autocast_bf16");
  return 0;
}
