// The tracking allocator: 64-byte aligned blocks, current and peak bytes in total and per dtype.
#include "castor/allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>

namespace castor {

namespace {
std::mutex g_mu;
MemoryStats g_stats;
}  // namespace

void* allocate(size_t nbytes, DType dtype) {
  const size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(g_mu);
  const int d = static_cast<int>(dtype);
  g_stats.current_bytes += nbytes;
  g_stats.current_by_dtype[d] += nbytes;
  g_stats.peak_bytes = std::max(g_stats.peak_bytes, g_stats.current_bytes);
  g_stats.peak_by_dtype[d] = std::max(g_stats.peak_by_dtype[d], g_stats.current_by_dtype[d]);
  return p;
}

void deallocate(void* ptr, size_t nbytes, DType dtype) {
  std::free(ptr);
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.current_bytes -= nbytes;
  g_stats.current_by_dtype[static_cast<int>(dtype)] -= nbytes;
}

MemoryStats memory_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void reset_peak_memory_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.peak_bytes = g_stats.current_bytes;
  g_stats.peak_by_dtype = g_stats.current_by_dtype;
}

}  // namespace castor
