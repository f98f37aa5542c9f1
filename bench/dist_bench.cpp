// Data-parallel throughput on one machine: 2 ranks x 1 thread (mpirun) against 1 process x 2 threads, the share of a
// step spent waiting for gradients with and without overlap, and Open MPI's all-reduce time from 4 KB to 64 MB.
//
// Usage: dist_bench [simplecnn|resnet18|all] [steps]   (default: all, 4 timed steps after 1 warm-up; ~3 minutes here)
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
  // The same count on both ranks (a count decided by each rank's own clock would leave one waiting forever).
  const int reps = elements >= (int64_t{1} << 20) ? 5 : 20;
  for (int rep = 0; rep < reps; ++rep) {
    dist::barrier();
    const auto t0 = Clock::now();
    dist::all_reduce(t);
    best = std::min(best, seconds_since(t0));
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
      if (rank0) std::printf("step %s %d %.3f %.4f %.2f\n", m.c_str(), overlap ? 1 : 0, r.images_per_sec, r.wait_share,
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
  const std::vector<std::string> models =
      which == "all" ? std::vector<std::string>{"simplecnn", "resnet18"} : std::vector<std::string>{which};
  if (is_worker) {
    omp_set_num_threads(1);
    worker(models, steps);
    return 0;
  }

  // 1 process x 2 threads on the global batch, and 1 process x 1 thread on one rank's half (the scaling baseline).
  std::map<std::string, StepResult> single, one_thread;
  for (const std::string& m : models) {
    omp_set_num_threads(2);
    single[m] = train_steps(m, global_batch(m), steps, /*overlap=*/true);
    omp_set_num_threads(1);
    one_thread[m] = train_steps(m, global_batch(m) / 2, steps, /*overlap=*/true);
  }

  // 2 ranks x 1 thread: this same binary under mpirun.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return std::fprintf(stderr, "dist_bench: cannot find its own path\n"), 1;
  exe[n] = '\0';
  std::ostringstream cmd;
  cmd << "OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --bind-to none" << (geteuid() == 0 ? " --allow-run-as-root" : "")
      << " " << exe << " --worker " << which << " " << steps;
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return std::fprintf(stderr, "dist_bench: cannot run mpirun\n"), 1;
  std::vector<std::string> lines;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) lines.push_back(buf);
  if (pclose(p) != 0) return std::fprintf(stderr, "dist_bench: the mpirun worker failed\n"), 1;

  std::printf("all-reduce, 2 ranks, Open MPI over shared memory (best of repeats; bus bandwidth = bytes / time, as\n"
              "a ring sends 2(N-1)/N = 1x the buffer per rank at N = 2)\n");
  std::printf("%10s %12s %10s %14s %10s\n", "bytes", "f32 us", "f32 GB/s", "bf16 wire us", "bf16/f32");
  std::map<std::string, std::map<int, std::vector<double>>> steps_2x1;
  for (const std::string& line : lines) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "allreduce") {
      long long bytes;
      double f32, bf16;
      in >> bytes >> f32 >> bf16;
      std::printf("%10lld %12.1f %10.2f %14.1f %10.2f\n", bytes, 1e6 * f32, bytes / f32 / 1e9, 1e6 * bf16, bf16 / f32);
    } else if (kind == "step") {
      std::string m;
      int overlap;
      double ips, wait, ms;
      in >> m >> overlap >> ips >> wait >> ms;
      steps_2x1[m][overlap] = {ips, wait, ms};
    }
  }
  std::printf("\n(bf16 wire: the same number of gradients as the f32 row's bytes/4, sent as bfloat16)\n\n");
  std::printf("images/s of the global batch; 1x1: one thread on one rank's half, efficiency = 2x1 / (2 x 1x1);\n"
              "wait: share of the 2x1 step waiting for gradients at the end of backward (with / without overlap)\n");
  std::printf("%-10s %6s %10s %10s %10s %8s %10s %8s %12s %8s\n", "model", "batch", "1x2", "2x1", "2x1/1x2", "1x1",
              "efficiency", "wait", "2x1 no-ovl", "wait");
  for (const std::string& m : models) {
    const auto& r = steps_2x1[m];
    if (!r.count(1) || !r.count(0)) continue;
    std::printf("%-10s %6lld %10.1f %10.1f %9.2fx %8.1f %9.0f%% %7.1f%% %12.1f %7.1f%%\n", m.c_str(),
                static_cast<long long>(global_batch(m)), single[m].images_per_sec, r.at(1)[0],
                r.at(1)[0] / single[m].images_per_sec, one_thread[m].images_per_sec,
                100 * r.at(1)[0] / (2 * one_thread[m].images_per_sec), 100 * r.at(1)[1], r.at(0)[0], 100 * r.at(0)[1]);
  }
  return 0;
}
