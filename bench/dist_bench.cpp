// Data-parallel throughput on one machine: 2 ranks x 1 thread (mpirun) against 1 process x 2 threads, the share of a
// step spent waiting for gradients with and without overlap, and Open MPI's all-reduce time from 4 KB to 64 MB.
//
// Usage: dist_bench [simplecnn|resnet18|all] [steps] [rounds]   (default: all, 4 timed steps after 1 warm-up, 3 rounds;
// about 8 minutes here). Each round measures every configuration once; step figures are medians over rounds and
// all-reduce times the best over rounds (the machine is shared: a rank that loses its core stalls both).
// It measures 1 x 2 threads and 1 x 1 thread (on one rank's half of the batch: the baseline of scaling efficiency)
// itself, then runs itself as `mpirun -np 2 dist_bench --worker ...` for the rest and prints
// both side by side. Steps are O0 float32 (forward, cross_entropy, backward, Adam) on CIFAR-shaped random batches of
// a fixed global size (SimpleCNN 256, ResNet-18 64), split evenly between the ranks; images/s counts both ranks.
// "wait" is the time backward's end spends waiting for all-reduces still in flight (DDPStats::wait_seconds), as a share
// of the step; without overlap every bucket is sent only when backward has finished.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "omp.h"
#include "bench_util.h"

namespace {

using namespace castor;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct StepResult {
  double images_per_sec = 0, wait_share = 0, step_ms = 0;
};

int64_t global_batch(const std::string& model) { return model == "resnet18" ? 64 : 256; }

// Median over `steps` timed training steps (after one warm-up) of `batch` images per rank; images/s counts every rank.
StepResult train_steps(const std::string& name, int64_t batch, int steps, bool overlap) {
  const int world = dist::world_size();
  manual_seed(1);
  nn::ModulePtr model = models::make_model(name, 3, 32, 32, 10);
  std::shared_ptr<nn::DistributedDataParallel> ddp;
  if (world > 1) ddp = std::make_shared<nn::DistributedDataParallel>(model, nn::DDPOptions{.overlap = overlap});
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  Generator gen(7 + dist::rank());
  const Tensor x = randn({batch, 3, 32, 32}, DType::Float32, &gen);
  Tensor y = empty({batch}, DType::Int64);
  for (int64_t i = 0; i < batch; ++i) y.data<int64_t>()[i] = i % 10;
  std::vector<double> times, waits;
  for (int s = 0; s <= steps; ++s) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    F::cross_entropy((*model)(x), y).backward();
    opt.step();
    if (world > 1) dist::barrier();  // the step ends when both ranks have finished it
    if (s == 0) continue;
    times.push_back(seconds_since(t0));
    waits.push_back(ddp ? ddp->stats().wait_seconds : 0.0);
  }
  std::vector<size_t> order(times.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a] < times[b]; });
  const size_t mid = order[order.size() / 2];
  return {static_cast<double>(batch * world) / times[mid], waits[mid] / times[mid], 1e3 * times[mid]};
}

// The best time of an all-reduce of `elements` gradients (float32, or bfloat16 with float32 additions) over repeats.
double all_reduce_seconds(int64_t elements, DType dtype) {
  const Tensor t = ones({elements}, dtype);
  double best = 1e30;
  // Counts fixed in advance, the same on both ranks (a count decided by each rank's own clock would leave one
  // waiting forever): 10 batches of back-to-back calls, each batch moving at least ~4 MB.
  const int per_batch = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 20) / elements, 1, 50));
  for (int rep = 0; rep < 10; ++rep) {
    dist::barrier();
    const auto t0 = Clock::now();
    for (int k = 0; k < per_batch; ++k) dist::all_reduce(t);
    best = std::min(best, seconds_since(t0) / per_batch);
  }
  // Both ranks' times: the collective ends when the slower one is done.
  Tensor worst = scalar_tensor(best, DType::Float64);
  dist::all_reduce(worst, dist::ReduceOp::Max);
  return worst.item();
}

void worker(const std::vector<std::string>& models, int steps) {
  const bool rank0 = dist::rank() == 0;
  for (int64_t bytes = 4096; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const double f32 = all_reduce_seconds(bytes / 4, DType::Float32);
    const double bf16 = all_reduce_seconds(bytes / 4, DType::BFloat16);  // the same gradients in half the bytes
    if (rank0) std::printf("allreduce %lld %.9f %.9f\n", static_cast<long long>(bytes), f32, bf16);
  }
  for (const std::string& m : models)
    for (bool overlap : {true, false}) {
      const StepResult r = train_steps(m, global_batch(m) / 2, steps, overlap);
      if (rank0)
        std::printf("step %s %d %.3f %.4f %.2f\n", m.c_str(), overlap ? 1 : 0, r.images_per_sec, r.wait_share,
                    r.step_ms);
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool is_worker = !args.empty() && args[0] == "--worker";
  if (is_worker) args.erase(args.begin());
  const std::string which = !args.empty() ? args[0] : "all";
  const int steps = args.size() > 1 ? std::max(2, std::atoi(args[1].c_str())) : 4;
  const int rounds = args.size() > 2 ? std::max(1, std::atoi(args[2].c_str())) : 3;
  const std::vector<std::string> models = which == "all" ? std::vector<std::string>{"simplecnn", "resnet18"}
                                                         : std::vector<std::string>{which};
  if (is_worker) {
    omp_set_num_threads(1);
    worker(models, steps);
    return 0;
  }
  std::printf("cpu: %s\n", castor::bench::cpu_isa().c_str());
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return std::fprintf(stderr, "dist_bench: cannot find its own path\n"), 1;
  exe[n] = '\0';
  std::ostringstream cmd;
  cmd << "OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --bind-to none"
      << (geteuid() == 0 ? " --allow-run-as-root" : "") << " " << exe << " --worker " << which << " " << steps;

  // Per model: images/s of 1x2, 1x1, 2x1 and 2x1 without overlap, and the two wait shares, one entry per round.
  std::map<std::string, std::map<std::string, std::vector<double>>> runs;
  std::map<long long, std::pair<double, double>> curve;  // bytes -> best (f32, bf16) seconds
  for (int round = 0; round < rounds; ++round) {
    // 1 process x 2 threads on the global batch, and 1 process x 1 thread on one rank's half (the scaling baseline).
    for (const std::string& m : models) {
      omp_set_num_threads(2);
      runs[m]["1x2"].push_back(train_steps(m, global_batch(m), steps, /*overlap=*/true).images_per_sec);
      omp_set_num_threads(1);
      runs[m]["1x1"].push_back(train_steps(m, global_batch(m) / 2, steps, /*overlap=*/true).images_per_sec);
    }
    // 2 ranks x 1 thread: this same binary under mpirun.
    FILE* p = popen(cmd.str().c_str(), "r");
    if (!p) return std::fprintf(stderr, "dist_bench: cannot run mpirun\n"), 1;
    char buf[512];
    std::vector<std::string> lines;
    while (std::fgets(buf, sizeof(buf), p)) lines.push_back(buf);
    if (pclose(p) != 0) return std::fprintf(stderr, "dist_bench: the mpirun worker failed\n"), 1;
    for (const std::string& line : lines) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "allreduce") {
        long long bytes;
        double f32, bf16;
        in >> bytes >> f32 >> bf16;
        auto it = curve.find(bytes);
        if (it == curve.end())
          curve[bytes] = {f32, bf16};
        else
          it->second = {std::min(it->second.first, f32), std::min(it->second.second, bf16)};
      } else if (kind == "step") {
        std::string m;
        int overlap;
        double ips, wait, ms;
        in >> m >> overlap >> ips >> wait >> ms;
        runs[m][overlap ? "2x1" : "2x1 no-overlap"].push_back(ips);
        runs[m][overlap ? "wait" : "wait no-overlap"].push_back(wait);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };

  std::printf(
      "all-reduce, 2 ranks, Open MPI over shared memory (best over rounds; GB/s = bytes / time, as a ring\n"
      "sends 2(N-1)/N = 1x the buffer per rank at N = 2); bf16 wire: the same gradients sent as bfloat16\n");
  std::printf("%10s %12s %10s %14s %10s\n", "bytes", "f32 us", "f32 GB/s", "bf16 wire us", "bf16/f32");
  for (const auto& [bytes, t] : curve)
    std::printf("%10lld %12.1f %10.2f %14.1f %10.2f\n", bytes, 1e6 * t.first, bytes / t.first / 1e9, 1e6 * t.second,
                t.second / t.first);
  std::printf(
      "\nimages/s of the global batch, median of %d rounds; 1x1: one thread on one rank's half, efficiency =\n"
      "2x1 / (2 x 1x1); wait: share of the 2x1 step waiting for gradients at the end of backward\n",
      rounds);
  std::printf("%-10s %6s %10s %10s %10s %8s %10s %8s %12s %8s\n", "model", "batch", "1x2", "2x1", "2x1/1x2", "1x1",
              "efficiency", "wait", "2x1 no-ovl", "wait");
  for (const std::string& m : models) {
    auto& r = runs[m];
    const double x12 = median(r["1x2"]), x11 = median(r["1x1"]), x21 = median(r["2x1"]);
    std::printf("%-10s %6lld %10.1f %10.1f %9.2fx %8.1f %9.0f%% %7.1f%% %12.1f %7.1f%%\n", m.c_str(),
                static_cast<long long>(global_batch(m)), x12, x21, x21 / x12, x11, 100 * x21 / (2 * x11),
                100 * median(r["wait"]), median(r["2x1 no-overlap"]), 100 * median(r["wait no-overlap"]));
  }
  return 0;
}
