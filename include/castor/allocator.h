// Host memory allocator that tracks current and peak bytes, in total and per dtype.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "castor/dtype.h"

namespace castor {

struct MemoryStats {
  int64_t current_bytes = 0;   // bytes of live tensors
  int64_t peak_bytes = 0;
  int64_t cached_bytes = 0;    // freed blocks kept for reuse (PyTorch's reserved minus allocated)
  std::array<int64_t, kNumDTypes> current_by_dtype{};
  std::array<int64_t, kNumDTypes> peak_by_dtype{};
};

// 64-byte aligned allocations, counted under `dtype`. Thread-safe. Freed blocks are cached by size and
// reused (fresh pages cost a page fault each; a training step allocates the same sizes every time).
void* allocate(size_t nbytes, DType dtype);
void deallocate(void* ptr, size_t nbytes, DType dtype);
// Returns every cached block to the system.
void empty_cache();

MemoryStats memory_stats();
// Resets the peaks to the current values (like torch.cuda.reset_peak_memory_stats).
void reset_peak_memory_stats();

}  // namespace castor
