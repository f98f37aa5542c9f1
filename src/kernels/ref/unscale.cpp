// The fused unscale-and-check kernel of GradScaler: one pass scales every gradient element and tests it for inf/NaN.
#include <algorithm>
#include <cmath>
#include <vector>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/kernels.h"

namespace castor::kernels {

namespace {

// Calls f(offset, i) for each element of t in row-major order: offset in elements from data_ptr(), i linear.
template <class F>
void for_each_offset(const Tensor& t, F f) {
  const int64_t n = t.numel(), nd = t.dim();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(off, i);
    for (int64_t d = nd - 1; d >= 0; --d) {
      off += t.stride(d);
      if (++idx[d] < t.size(d)) break;
      off -= t.stride(d) * t.size(d);
      idx[d] = 0;
    }
  }
}

// Contiguous source: blocks converted to float, scaled, converted to dst's dtype.
bool unscale_dense(const Tensor& src, const Tensor& dst, float inv) {
  const int64_t n = src.numel();
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const size_t ses = src.element_size(), des = dst.element_size();
  int bad = 0;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, len = std::min(n, lo + kBlock) - lo;
    float buf[kBlock];
    const float* in = src.dtype() == DType::Float32 ? reinterpret_cast<const float*>(s) + lo : buf;
    if (src.dtype() != DType::Float32) convert(s + lo * ses, src.dtype(), buf, DType::Float32, len);
    float* out = dst.dtype() == DType::Float32 ? reinterpret_cast<float*>(d) + lo : buf;
    int local = 0;
    for (int64_t i = 0; i < len; ++i) {
      local |= !std::isfinite(in[i]);
      out[i] = in[i] * inv;
    }
    bad |= local;
    if (dst.dtype() != DType::Float32) convert(buf, DType::Float32, d + lo * des, dst.dtype(), len);
  }
  return bad != 0;
}

template <class T>
bool unscale_strided(const Tensor& src, const Tensor& dst, bool in_place, float inv) {
  const T* s = static_cast<const T*>(src.data_ptr());
  bool bad = false;
  if (in_place) {
    T* d = static_cast<T*>(dst.data_ptr());
    for_each_offset(src, [&](int64_t off, int64_t) {
      const float v = static_cast<float>(s[off]);
      bad |= !std::isfinite(v);
      d[off] = T(v * inv);
    });
  } else {
    float* d = dst.data<float>();
    for_each_offset(src, [&](int64_t off, int64_t i) {
      const float v = static_cast<float>(s[off]);
      bad |= !std::isfinite(v);
      d[i] = v * inv;
    });
  }
  return bad;
}

bool unscale_double(const Tensor& src, float inv) {
  double* p = static_cast<double*>(src.data_ptr());
  bool bad = false;
  for_each_offset(src, [&](int64_t off, int64_t) {
    bad |= !std::isfinite(p[off]);
    p[off] *= static_cast<double>(inv);
  });
  return bad;
}

}  // namespace

bool unscale(const Tensor& src, const Tensor& dst, float inv_scale) {
  CASTOR_CHECK(is_floating(src.dtype()), "unscale: gradient ", src.describe(), " is not floating point");
  CASTOR_ASSERT(dst.shape() == src.shape(), "unscale: ", dst.describe(), " vs ", src.describe());
  const bool in_place = src.data_ptr() == dst.data_ptr() && src.strides() == dst.strides();
  CASTOR_ASSERT(in_place || (dst.dtype() == DType::Float32 && dst.is_contiguous()), "unscale: bad destination ",
                dst.describe());
  if (src.dtype() == DType::Float64) {
    CASTOR_ASSERT(in_place, "unscale: a float64 gradient is unscaled in place");
    return unscale_double(src, inv_scale);
  }
  if (src.is_contiguous() && (in_place || dst.is_contiguous())) return unscale_dense(src, dst, inv_scale);
  switch (src.dtype()) {
    case DType::Float32: return unscale_strided<float>(src, dst, in_place, inv_scale);
    case DType::Float16: return unscale_strided<Half>(src, dst, in_place, inv_scale);
    case DType::BFloat16: return unscale_strided<BFloat16>(src, dst, in_place, inv_scale);
    default: CASTOR_ASSERT(false, "unscale: unexpected dtype ", src.describe());
  }
}

}  // namespace castor::kernels
