// The OpenMP wait policy the castor command chooses for itself: per job, and for the other work on the machine.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/trainer.h"

namespace castor::train {

namespace {

// A language model whose blocks hold at least this many weights (12 n_layer n_embd^2: GPT-2 124M has 85M, nanoGPT's
// default GPT 10.6M, llama-15m 6M) spends its steps in GEMMs long enough that its threads gain nothing by spinning.
constexpr double kLargeModelWeights = 32e6;

// /proc/stat's first line: the jiffies all CPUs spent running others' work (user, system, irq, softirq, steal; not
// nice, not idle or iowait) and in all; false when unreadable.
bool cpu_jiffies(double* busy, double* total) {
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return false;
  double v[8] = {};  // user nice system idle iowait irq softirq steal
  const bool ok = std::fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                              &v[7]) == 8;
  std::fclose(f);
  *busy = v[0] + v[2] + v[5] + v[6] + v[7];
  *total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  return ok;
}

}  // namespace

std::string OpenMpWait::text() const { return detail::cat(variable, "=", value, " (", reason, ")"); }

// 3,000 spins: on idle cores as fast as the default 300,000 (and faster than 1,000 or 10,000 on the default GPT job:
// 34-37k tokens/s against 29-32k and 31-35k), under load 2-2.5x faster than the default.
OpenMpWait default_openmp_wait() { return {"GOMP_SPINCOUNT", "3000", "a bounded spin"}; }

OpenMpWait choose_openmp_wait(const TrainConfig& c, int cpus, double busy_cores) {
  cpus = std::max(cpus, 1);
  const int ranks = std::max(c.nproc, 1);
  const int threads = ranks * (c.threads > 0 ? c.threads : std::max(1, cpus / ranks));  // the job's, all ranks
  // Half a core of slack: a load average of 0.3 is a shell, not a competitor.
  if (busy_cores + threads > cpus + 0.5) {
    char why[128];
    std::snprintf(why, sizeof(why), "other processes keep %.1f of %d cores busy", busy_cores, cpus);
    return {"OMP_WAIT_POLICY", "passive", why};
  }
  const double block_weights = 12.0 * static_cast<double>(c.n_layer) * static_cast<double>(c.n_embd) *
                               static_cast<double>(c.n_embd);
  if (is_language_model(c.model) && block_weights >= kLargeModelWeights)
    return {"OMP_WAIT_POLICY", "passive", detail::cat("a large model: ", c.n_layer, " blocks of width ", c.n_embd)};
  return default_openmp_wait();
}

TrainConfig openmp_wait_job(const TrainConfig& c) {
  if (c.resume.empty()) return c;
  // --resume RUN or RUN/checkpoints/step-N: the run's config.json (unreadable: the flags as they are; the run
  // reports the problem itself).
  namespace fs = std::filesystem;
  for (const fs::path& run : {fs::path(c.resume), fs::path(c.resume).parent_path().parent_path()}) {
    try {
      const std::vector<uint8_t> bytes = read_file((run / "config.json").string());
      return resume_config(c, Json::parse(std::string(bytes.begin(), bytes.end())), c.resume);
    } catch (const Error&) {
    }
  }
  return c;
}

int online_cpus() { return static_cast<int>(std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN))); }

double busy_cores(int window_ms) {
  double busy0 = 0, total0 = 0, busy1 = 0, total1 = 0;
  if (!cpu_jiffies(&busy0, &total0)) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(window_ms));
  if (!cpu_jiffies(&busy1, &total1) || total1 <= total0) return 0;
  return (busy1 - busy0) / (total1 - total0) * online_cpus();
}

}  // namespace castor::train
