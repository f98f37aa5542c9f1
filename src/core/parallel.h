// Block-parallel loops over n elements (OpenMP): the one threading helper of kernels and optimizer updates.
#pragma once
#include <algorithm>
#include <cstdint>

namespace castor {

inline constexpr int64_t kBlock = 2048;             // elements per block of a 16-bit map (fits in L1 as float)
inline constexpr int64_t kParallelGrain = 1 << 15;  // below this many elements, stay on one thread

// Runs body(begin, end) over [0, n) in blocks, on all threads when n is large.
template <class Body>
void parallel_blocks(int64_t n, Body body) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) body(b * kBlock, std::min(n, (b + 1) * kBlock));
}

}  // namespace castor
