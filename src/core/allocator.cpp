// The tracking allocator: 64-byte aligned blocks cached by size class, current and peak bytes per dtype.
#include "castor/allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace castor {

namespace {

constexpr size_t kMaxCached = size_t{2} << 30;  // beyond this, freed blocks go back to the system

std::mutex g_mu;
MemoryStats g_stats;
std::unordered_map<size_t, std::vector<void*>> g_free;  // size class -> cached blocks

// Size classes: multiples of 64 B up to 64 KiB, of 4 KiB up to 1 MiB, then of 64 KiB (waste under 7%).
size_t size_class(size_t n) {
  n = std::max<size_t>(n, 1);
  const size_t step = n <= (64 << 10) ? 64 : n <= (1 << 20) ? 4096 : (64 << 10);
  return (n + step - 1) / step * step;
}

}  // namespace

void* allocate(size_t nbytes, DType dtype) {
  const size_t cls = size_class(nbytes);
  void* p = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_free.find(cls);
  if (it != g_free.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    g_stats.cached_bytes -= static_cast<int64_t>(cls);
  } else {
    p = std::aligned_alloc(64, cls);
    if (!p) {
      // Give the cache back and try once more before failing.
      for (auto& [c, blocks] : g_free)
        for (void* b : blocks) std::free(b);
      g_free.clear();
      g_stats.cached_bytes = 0;
      p = std::aligned_alloc(64, cls);
      if (!p) throw std::bad_alloc();
    }
  }
  const int d = static_cast<int>(dtype);
  g_stats.current_bytes += nbytes;
  g_stats.current_by_dtype[d] += nbytes;
  g_stats.peak_bytes = std::max(g_stats.peak_bytes, g_stats.current_bytes);
  g_stats.peak_by_dtype[d] = std::max(g_stats.peak_by_dtype[d], g_stats.current_by_dtype[d]);
  return p;
}

void deallocate(void* ptr, size_t nbytes, DType dtype) {
  const size_t cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.current_bytes -= nbytes;
  g_stats.current_by_dtype[static_cast<int>(dtype)] -= nbytes;
  if (g_stats.cached_bytes + static_cast<int64_t>(cls) > static_cast<int64_t>(kMaxCached)) {
    std::free(ptr);
    return;
  }
  g_free[cls].push_back(ptr);
  g_stats.cached_bytes += static_cast<int64_t>(cls);
}

void empty_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [c, blocks] : g_free)
    for (void* b : blocks) std::free(b);
  g_free.clear();
  g_stats.cached_bytes = 0;
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
