// Host memory allocator that tracks current and peak bytes, in total and per dtype.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "castor/dtype.h"

namespace castor {

struct MemoryStats {
  int64_t current_bytes = 0;  // bytes of live tensors
  int64_t peak_bytes = 0;
  int64_t cached_bytes = 0;  // freed blocks kept for reuse (PyTorch's reserved minus allocated)
  std::array<int64_t, kNumDTypes> current_by_dtype{};
  std::array<int64_t, kNumDTypes> peak_by_dtype{};
};

// 64-byte aligned allocations, counted under `dtype`. Thread-safe. Freed blocks are cached by size and
// reused (fresh pages cost a page fault each; a training step allocates the same sizes every time). When the system
// has no memory for it (even after the cache is given back): castor::Error "out of memory: cannot allocate N bytes
// (size) of DTYPE for OP", OP from the innermost AllocationLabel on this thread (else "a new tensor", as from a
// factory); never std::bad_alloc.
void* allocate(size_t nbytes, DType dtype);

// Names the op whose allocations follow on this thread while it lives, for allocate's out-of-memory error (each op
// holds one). `op` must outlive it (a string literal or an op table's name).
class AllocationLabel {
 public:
  explicit AllocationLabel(const char* op);
  ~AllocationLabel();
  AllocationLabel(const AllocationLabel&) = delete;
  AllocationLabel& operator=(const AllocationLabel&) = delete;

 private:
  const char* previous_;
};
void deallocate(void* ptr, size_t nbytes, DType dtype);
// Returns every cached block to the system (with glibc, the free pages its heap keeps too: malloc_trim).
void empty_cache();

MemoryStats memory_stats();
// Resets the peaks to the current values (like torch.cuda.reset_peak_memory_stats).
void reset_peak_memory_stats();

}  // namespace castor
