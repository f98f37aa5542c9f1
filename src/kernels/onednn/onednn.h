// Shared oneDNN plumbing: the CPU engine and stream, dtype mapping, and hashing for primitive caches.
#pragma once
#include <dnnl.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "castor/tensor.h"

namespace castor::kernels {

dnnl::engine& engine();
dnnl::stream& stream();
dnnl::memory::data_type to_dnnl(DType d);  // throws castor::Error for dtypes oneDNN lacks

// Whether matrix products and convolutions in `dt` run on oneDNN's kernels for that dtype rather than on float32
// copies of the 16-bit values: float32 always, bfloat16 only where the CPU has bf16 dot-product units
// (backends::bf16_dot_units(); without them oneDNN 2.6's bfloat16 kernels emulate the dot products on AVX-512,
// 3-4x slower than float32 sgemm, or are reference loops on AVX2), float16 never.
bool native_products(DType dt);

inline size_t hash_bytes(const void* p, size_t n) {
  return std::hash<std::string_view>()(std::string_view(static_cast<const char*>(p), n));
}

// A process-wide, thread-safe cache of primitives keyed by a plain struct compared and hashed by its bytes (so a
// key must have no padding). `build(key)` makes the value on a miss; a null value ("oneDNN has no implementation
// for this on this CPU") is cached too.
template <class Key, class Value>
class PrimitiveCache {
 public:
  template <class Build>
  const Value* get(const Key& key, Build build) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) it = map_.emplace(key, build(key)).first;
    return it->second.get();
  }

 private:
  struct Hash {
    size_t operator()(const Key& k) const { return hash_bytes(&k, sizeof(k)); }
  };
  struct Equal {
    bool operator()(const Key& a, const Key& b) const { return std::memcmp(&a, &b, sizeof(Key)) == 0; }
  };
  std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Value>, Hash, Equal> map_;
};

}  // namespace castor::kernels
