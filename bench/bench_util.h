// Timing helpers shared by the benchmarks.
#pragma once
#include <algorithm>
#include <chrono>

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

}  // namespace castor::bench
