// Shared oneDNN plumbing: the CPU engine and stream, dtype mapping, and hashing for primitive caches.
#pragma once
#include <dnnl.hpp>

#include <cstring>
#include <string_view>

#include "castor/tensor.h"

namespace castor::kernels {

dnnl::engine& engine();
dnnl::stream& stream();
dnnl::memory::data_type to_dnnl(DType d);  // throws castor::Error for dtypes oneDNN lacks

inline size_t hash_bytes(const void* p, size_t n) {
  return std::hash<std::string_view>()(std::string_view(static_cast<const char*>(p), n));
}

}  // namespace castor::kernels
