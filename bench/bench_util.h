// Timing and machine-description helpers shared by the benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace castor::bench {

// The best of `reps` timed calls of fn after one warm-up call (page faults, thread pool), in seconds.
template <class F>
double best_seconds(const F& fn, int reps = 5) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The CPU and the instruction sets the kernels can use, from /proc/cpuinfo: "AMD EPYC; ISA avx512_bf16 avx512f
// avx2 f16c" (the bfloat16 results of a benchmark mean little without it).
inline std::string cpu_isa() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t"));
    if (key == "model" && line.rfind("model name", 0) == 0 && model == "unknown CPU") model = line.substr(colon + 2);
    if (key == "flags" && flags.empty()) flags = " " + line.substr(colon + 1) + " ";
  }
  std::string isa;
  for (const char* f : {"amx_bf16", "avx512_fp16", "avx512_bf16", "avx512f", "avx2", "f16c"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) isa += std::string(" ") + f;
  return model + "; ISA" + (isa.empty() ? " baseline x86-64" : isa);
}

}  // namespace castor::bench
