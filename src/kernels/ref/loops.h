// Loop templates for element-wise kernels: the dtype switch sits outside, the inner loops are plain and vectorise.
#pragma once
#include <algorithm>
#include <cstdint>

#include "castor/convert.h"
#include "castor/tensor.h"
#include "core/parallel.h"

namespace castor::kernels {

// The type ops compute in: float for float32 and the 16-bit types, double for float64 and the integers.
template <class Fn>
void with_compute_type(DType d, Fn fn) {
  if (d == DType::Float32 || is_16bit_float(d))
    fn(float{});
  else
    fn(double{});
}

// dst[i] = f(src[i]) over contiguous tensors of the same dtype.
template <class F>
void map_float(const Tensor& src, const Tensor& dst, F f) {
  const int64_t n = dst.numel();
  const DType d = dst.dtype();
  if (d == DType::Float32 || d == DType::Float64) {
    auto typed = [&](auto tag) {
      using T = decltype(tag);
      const T* s = static_cast<const T*>(src.data_ptr());
      T* o = static_cast<T*>(dst.data_ptr());
      parallel_blocks(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = f(s[i]);
      });
    };
    d == DType::Float32 ? typed(float{}) : typed(double{});
    return;
  }
  const size_t es = dtype_size(d);
  const char* s = static_cast<const char*>(src.data_ptr());
  char* o = static_cast<char*>(dst.data_ptr());
  with_compute_type(d, [&](auto tag) {
    using T = decltype(tag);
    parallel_blocks(n, [&](int64_t b, int64_t e) {
      T buf[kBlock];
      convert(s + b * es, d, buf, dtype_of<T>(), e - b);
      for (int64_t i = 0; i < e - b; ++i) buf[i] = f(buf[i]);
      convert(buf, dtype_of<T>(), o + b * es, d, e - b);
    });
  });
}

// Elements [b, e) of x as T: a pointer into x when it already holds T, else converted into buf. A single
// (broadcast) element is replicated into buf, so callers index every operand the same way.
template <class T>
const T* load_block(const Tensor& x, int64_t b, int64_t e, T* buf) {
  if (x.numel() == 1) {
    convert(x.data_ptr(), x.dtype(), buf, dtype_of<T>(), 1);
    std::fill(buf + 1, buf + (e - b), buf[0]);
    return buf;
  }
  if (x.dtype() == dtype_of<T>()) return static_cast<const T*>(x.data_ptr()) + b;
  convert(static_cast<const char*>(x.data_ptr()) + b * x.element_size(), x.dtype(), buf, dtype_of<T>(), e - b);
  return buf;
}

// dst[i] = f(a[i], b[i]) where a or b may be a single broadcast element; a, b of dst's dtype.
template <class F>
void zip(const Tensor& a, const Tensor& b, const Tensor& dst, F f) {
  const int64_t n = dst.numel();
  const DType d = dst.dtype();
  const bool sa = a.numel() == 1 && n != 1, sb = b.numel() == 1 && n != 1;
  if (d == DType::Float32 || d == DType::Float64) {
    auto typed = [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(a.data_ptr());
      const T* y = static_cast<const T*>(b.data_ptr());
      T* o = static_cast<T*>(dst.data_ptr());
      parallel_blocks(n, [&](int64_t lo, int64_t hi) {
        if (sb) {
          const T yv = y[0];
          for (int64_t i = lo; i < hi; ++i) o[i] = f(x[i], yv);
        } else if (sa) {
          const T xv = x[0];
          for (int64_t i = lo; i < hi; ++i) o[i] = f(xv, y[i]);
        } else {
          for (int64_t i = lo; i < hi; ++i) o[i] = f(x[i], y[i]);
        }
      });
    };
    d == DType::Float32 ? typed(float{}) : typed(double{});
    return;
  }
  const size_t es = dtype_size(d);
  char* o = static_cast<char*>(dst.data_ptr());
  with_compute_type(d, [&](auto tag) {
    using T = decltype(tag);
    parallel_blocks(n, [&](int64_t lo, int64_t hi) {
      T xb[kBlock], yb[kBlock];
      const T* x = load_block(a, lo, hi, xb);
      const T* y = load_block(b, lo, hi, yb);
      for (int64_t i = 0; i < hi - lo; ++i) xb[i] = f(x[i], y[i]);
      convert(xb, dtype_of<T>(), o + lo * es, d, hi - lo);
    });
  });
}

// dst[i] = f(a[i], b[i]) as bool; a and b of one dtype, either may be a single broadcast element.
template <class F>
void zip_to_bool(const Tensor& a, const Tensor& b, const Tensor& dst, F f) {
  const int64_t n = dst.numel();
  bool* o = dst.data<bool>();
  with_compute_type(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    parallel_blocks(n, [&](int64_t lo, int64_t hi) {
      T xb[kBlock], yb[kBlock];
      const T* x = load_block(a, lo, hi, xb);
      const T* y = load_block(b, lo, hi, yb);
      for (int64_t i = 0; i < hi - lo; ++i) o[lo + i] = f(x[i], y[i]);
    });
  });
}

}  // namespace castor::kernels
