// The loss-scale arithmetic: the fused unscale-and-check kernel, the scale update, option validation.
#include "amp/unscale.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "castor/grad_scaler.h"

#include "castor/convert.h"
#include "kernels/ref/loops.h"

namespace castor::amp {

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
  const int64_t blocks = (n + kernels::kBlock - 1) / kernels::kBlock;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > kernels::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kernels::kBlock, len = std::min(n, lo + kernels::kBlock) - lo;
    float buf[kernels::kBlock];
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

bool unscale_into(const Tensor& src, const Tensor& dst, float inv_scale) {
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

void GradScalerOptions::validate() const {
  CASTOR_CHECK(std::isfinite(init_scale) && init_scale > 0, "GradScaler: init_scale must be finite and > 0, got ",
               init_scale);
  CASTOR_CHECK(std::isfinite(growth_factor) && growth_factor > 1, "GradScaler: growth_factor must be > 1, got ",
               growth_factor);
  CASTOR_CHECK(backoff_factor > 0 && backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
               backoff_factor);
  CASTOR_CHECK(growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", growth_interval);
  CASTOR_CHECK(hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", hysteresis);
  CASTOR_CHECK(min_scale > 0 && min_scale <= max_scale && max_scale <= 3.4028234663852886e+38,
               "GradScaler: need 0 < min_scale <= max_scale <= float32 max, got min_scale ", min_scale,
               " and max_scale ", max_scale);
  CASTOR_CHECK(dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32,
               "GradScaler: dtype must be float16, bfloat16 or float32, got ", dtype_name(dtype));
}

void update_scale(ScaleState& s, bool found_inf, const GradScalerOptions& o) {
  if (found_inf) {
    CASTOR_CHECK(!o.raise_at_min_scale || s.hysteresis_left > 1 || static_cast<double>(s.scale) > o.min_scale,
                 "GradScaler: gradients overflowed with the loss scale already at min_scale ", o.min_scale,
                 " (raise_at_min_scale); the run cannot recover by scaling");
    s.growth_tracker = 0;
    if (s.hysteresis_left > 1) {
      --s.hysteresis_left;
      return;
    }
    s.scale = static_cast<float>(std::max(static_cast<double>(s.scale * static_cast<float>(o.backoff_factor)),
                                          o.min_scale));
    return;
  }
  if (o.consecutive_hysteresis) s.hysteresis_left = o.hysteresis;
  if (++s.growth_tracker < o.growth_interval) return;
  s.hysteresis_left = o.hysteresis;
  const float grown = s.scale * static_cast<float>(o.growth_factor);
  if (std::isfinite(grown)) s.scale = static_cast<float>(std::min(static_cast<double>(grown), o.max_scale));
  s.growth_tracker = 0;
}

float inverse_scale(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

bool non_finite_check_and_unscale_(const std::vector<Tensor>& grads, float inv_scale) {
  bool found = false;
  for (const Tensor& g : grads)
    if (g.defined()) found |= unscale_into(g, g, inv_scale);
  return found;
}

}  // namespace castor::amp
