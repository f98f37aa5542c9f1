// The tracking allocator: 64-byte aligned blocks cached by size class, current and peak bytes per dtype.
#include "castor/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "castor/check.h"

namespace castor {

namespace {

constexpr size_t kMaxCached = size_t{2} << 30;  // beyond this, freed blocks go back to the system
constexpr size_t kMaxAllocation = size_t{1} << 48;

struct State {
  std::mutex mu;
  MemoryStats stats;
  std::unordered_map<size_t, std::vector<void*>> free;  // size class -> cached blocks
};
// Never destroyed: tensors held by other static objects may be freed after static destructors have run.
State& state() {
  static State* s = new State;
  return *s;
}

// Size classes: multiples of 64 B up to 64 KiB, of 4 KiB up to 1 MiB, then of 64 KiB (waste under 7%).
size_t size_class(size_t n) {
  n = std::max<size_t>(n, 1);
  const size_t step = n <= (64 << 10) ? 64 : n <= (1 << 20) ? 4096 : (64 << 10);
  return (n + step - 1) / step * step;
}

thread_local const char* t_label = nullptr;

// `bytes` for people: "3.5 GiB".
std::string human_size(size_t bytes) {
  static const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace

AllocationLabel::AllocationLabel(const char* op) : previous_(t_label) { t_label = op; }
AllocationLabel::~AllocationLabel() { t_label = previous_; }

void* allocate(size_t nbytes, DType dtype) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  auto out_of_memory = [&] {
    return Error(detail::cat("out of memory: cannot allocate ", nbytes, " bytes (", human_size(nbytes), ") of ",
                             dtype_name(dtype), " for ", t_label ? t_label : "a new tensor", " (",
                             human_size(static_cast<size_t>(st.stats.current_bytes)), " held by live tensors)"));
  };
  // Beyond any 64-bit machine's address space (48 bits): refused without asking the system, so the answer is the
  // same on every machine and under sanitizers (whose allocators abort on such sizes).
  if (nbytes > kMaxAllocation) throw out_of_memory();
  const size_t cls = size_class(nbytes);
  void* p = nullptr;
  auto it = st.free.find(cls);
  if (it != st.free.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    st.stats.cached_bytes -= static_cast<int64_t>(cls);
  } else {
    p = std::aligned_alloc(64, cls);
    if (!p) {
      // Give the cache back and try once more before failing.
      for (auto& [c, blocks] : st.free)
        for (void* b : blocks) std::free(b);
      st.free.clear();
      st.stats.cached_bytes = 0;
      p = std::aligned_alloc(64, cls);
      if (!p) throw out_of_memory();
    }
  }
  const int d = static_cast<int>(dtype);
  st.stats.current_bytes += nbytes;
  st.stats.current_by_dtype[d] += nbytes;
  st.stats.peak_bytes = std::max(st.stats.peak_bytes, st.stats.current_bytes);
  st.stats.peak_by_dtype[d] = std::max(st.stats.peak_by_dtype[d], st.stats.current_by_dtype[d]);
  return p;
}

void deallocate(void* ptr, size_t nbytes, DType dtype) {
  const size_t cls = size_class(nbytes);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.stats.current_bytes -= nbytes;
  st.stats.current_by_dtype[static_cast<int>(dtype)] -= nbytes;
  if (st.stats.cached_bytes + static_cast<int64_t>(cls) > static_cast<int64_t>(kMaxCached)) {
    std::free(ptr);
    return;
  }
  st.free[cls].push_back(ptr);
  st.stats.cached_bytes += static_cast<int64_t>(cls);
}

void empty_cache() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  for (auto& [c, blocks] : st.free)
    for (void* b : blocks) std::free(b);
  st.free.clear();
  st.stats.cached_bytes = 0;
#ifdef __GLIBC__
  // glibc keeps freed blocks below its mmap threshold (which rises to 32 MiB as large blocks are freed) in its heap;
  // their free pages go back to the system too (a base quantized as it loads left 0.5-0.9 GB of them resident).
  malloc_trim(0);
#endif
}

MemoryStats memory_stats() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.stats;
}

void reset_peak_memory_stats() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.stats.peak_bytes = st.stats.current_bytes;
  st.stats.peak_by_dtype = st.stats.current_by_dtype;
}

}  // namespace castor
