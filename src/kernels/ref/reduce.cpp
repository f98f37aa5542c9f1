// Reduction kernels over the middle dim of an (outer, n, inner) view: sum, max/min, softmax and its backward.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/kernels.h"
#include "kernels/ref/loops.h"

namespace castor::kernels {

namespace {

// src as float32 or float64 (16-bit and integer inputs are widened once, exactly).
Tensor widened(const Tensor& src) {
  if (src.dtype() == DType::Float32 || src.dtype() == DType::Float64) return src;
  Tensor w = empty(src.shape(), src.dtype() == DType::Int64 ? DType::Float64 : DType::Float32);
  copy(src, w);
  return w;
}

template <class Fn>
void with_float_type(DType d, Fn fn) {
  if (d == DType::Float64)
    fn(double{});
  else
    fn(float{});
}

}  // namespace

double sum_of_squares(const Tensor& src_in, float scale, bool* nonfinite) {
  const Tensor src = src_in.is_contiguous() ? src_in : src_in.contiguous();
  const int64_t n = src.numel();
  if (src.dtype() == DType::Float64) {
    CASTOR_ASSERT(scale == 1.0f && !nonfinite, "sum_of_squares of float64 with a scale");
    const double* p = src.data<double>();
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += p[i] * p[i];
    return total;
  }
  CASTOR_ASSERT(src.dtype() == DType::Float32 || is_16bit_float(src.dtype()), "sum_of_squares of ", src.describe());
  const char* base = static_cast<const char*>(src.data_ptr());
  const int64_t es = static_cast<int64_t>(src.element_size());
  std::vector<double> partial((n + kBlock - 1) / kBlock);
  std::vector<char> bad(nonfinite ? partial.size() : 0);
  parallel_blocks(n, [&](int64_t b, int64_t e) {
    float buf[kBlock];
    const float* x = reinterpret_cast<const float*>(base + b * es);
    if (src.dtype() != DType::Float32) {
      convert(base + b * es, src.dtype(), buf, DType::Float32, e - b);
      x = buf;
    }
    __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 diff = _mm256_setzero_ps();  // x - x: 0 for finite x, NaN for inf and NaN
    int64_t i = 0;
    for (; i + 8 <= e - b; i += 8) {
      const __m256 in = _mm256_loadu_ps(x + i), v = _mm256_mul_ps(in, sv);
      if (nonfinite) diff = _mm256_or_ps(diff, _mm256_sub_ps(in, in));
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      acc[0] = _mm256_fmadd_pd(lo, lo, acc[0]);
      acc[1] = _mm256_fmadd_pd(hi, hi, acc[1]);
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(acc[0], acc[1]));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    bool any_bad = nonfinite && _mm256_movemask_ps(_mm256_cmp_ps(diff, diff, _CMP_UNORD_Q)) != 0;
    for (; i < e - b; ++i) {
      const float v = x[i] * scale;
      any_bad |= nonfinite && !std::isfinite(x[i]);
      sum += static_cast<double>(v) * v;
    }
    partial[b / kBlock] = sum;
    if (nonfinite) bad[b / kBlock] = any_bad;
  });
  double total = 0;
  for (double p : partial) total += p;
  if (nonfinite) *nonfinite = std::find(bad.begin(), bad.end(), 1) != bad.end();
  return total;
}

void sum_dim(const Tensor& src_in, int64_t outer, int64_t n, int64_t inner, const Tensor& dst) {
  // Over an outer dim a 16-bit src is read as it is, each task widening its slice of a row (a bias gradient: no
  // float32 copy of the whole gradient, and no parallel region for one).
  const bool narrow_columns = inner > 1 && is_16bit_float(src_in.dtype()) && src_in.is_contiguous();
  Tensor src = narrow_columns ? src_in : widened(src_in);
  Tensor acc = empty({outer * inner}, DType::Float64);
  double* a = acc.data<double>();
  with_float_type(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      const T* s = static_cast<const T*>(src.data_ptr());
#pragma omp parallel for if (outer * n > kParallelGrain)
      for (int64_t o = 0; o < outer; ++o) {
        const T* row = s + o * n;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
          s0 += row[j];
          s1 += row[j + 1];
          s2 += row[j + 2];
          s3 += row[j + 3];
        }
        for (; j < n; ++j) s0 += row[j];
        a[o] = (s0 + s1) + (s2 + s3);
      }
    } else {
      // Tasks of up to 512 columns of one outer index, so that a single outer index (a bias gradient: (R, C) summed
      // over R) spreads over the threads too; each column still sums in the order of j.
      constexpr int64_t kColumns = 512;
      const int64_t per_outer = (inner + kColumns - 1) / kColumns;
      const char* bytes = static_cast<const char*>(src.data_ptr());
      const size_t esize = src.element_size();
#pragma omp parallel if (outer * n * inner > kParallelGrain)
      {
        std::vector<T> buf(narrow_columns ? kColumns : 0);
#pragma omp for
        for (int64_t task = 0; task < outer * per_outer; ++task) {
          const int64_t o = task / per_outer, i0 = task % per_outer * kColumns, i1 = std::min(inner, i0 + kColumns);
          double* ao = a + o * inner;
          std::fill(ao + i0, ao + i1, 0.0);
          double* aw = ao + i0;
          for (int64_t j = 0; j < n; ++j) {
            const char* at = bytes + ((o * n + j) * inner + i0) * esize;  // columns [i0, i1) of row j
            const T* row = narrow_columns ? buf.data() : reinterpret_cast<const T*>(at);
            if (narrow_columns) convert(at, src.dtype(), buf.data(), dtype_of<T>(), static_cast<size_t>(i1 - i0));
            for (int64_t i = 0; i < i1 - i0; ++i) aw[i] += row[i];
          }
        }
      }
    }
  });
  copy(acc.view(dst.shape()), dst);
}

void extreme_dim(const Tensor& src_in, int64_t outer, int64_t n, int64_t inner, bool is_max, const Tensor& values,
                 const Tensor& indices) {
  CASTOR_CHECK(n > 0, (is_max ? "max" : "min"), ": cannot reduce an empty dim");
  Tensor src = widened(src_in);
  Tensor best = empty({outer * inner}, src.dtype());
  int64_t* idx = indices.data<int64_t>();
  with_float_type(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src.data_ptr());
    T* b = static_cast<T*>(best.data_ptr());
#pragma omp parallel for if (outer * n * inner > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = s + o * n * inner + i;
        T v = p[0];
        int64_t k = 0;
        for (int64_t j = 1; j < n && v == v; ++j) {
          T x = p[j * inner];
          if (x != x || (is_max ? x > v : x < v)) {
            v = x;
            k = j;
          }
        }
        b[o * inner + i] = v;
        idx[o * inner + i] = k;
      }
    }
  });
  copy(best.view(values.shape()), values);
}

void softmax_dim(const Tensor& src_in, int64_t outer, int64_t n, int64_t inner, bool log, const Tensor& dst) {
  Tensor src = widened(src_in);
  const bool direct = dst.dtype() == src.dtype();
  Tensor out = direct ? dst : empty(dst.shape(), src.dtype());
  with_float_type(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src.data_ptr());
    T* d = static_cast<T*>(out.data_ptr());
#pragma omp parallel for collapse(2) if (outer * n * inner > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = s + o * n * inner + i;
        T* q = d + o * n * inner + i;
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, p[j * inner]);
        T z = 0;
        for (int64_t j = 0; j < n; ++j) z += std::exp(p[j * inner] - m);
        if (log) {
          T lz = std::log(z);
          for (int64_t j = 0; j < n; ++j) q[j * inner] = p[j * inner] - m - lz;
        } else {
          for (int64_t j = 0; j < n; ++j) q[j * inner] = std::exp(p[j * inner] - m) / z;
        }
      }
    }
  });
  if (!direct) copy(out, dst);
}

void softmax_backward_dim(const Tensor& grad_in, const Tensor& out_in, int64_t outer, int64_t n, int64_t inner,
                          bool log, const Tensor& dst) {
  Tensor g = widened(grad_in), y = widened(out_in);
  if (g.dtype() != y.dtype()) {
    Tensor c = empty(g.shape(), y.dtype());
    copy(g, c);
    g = c;
  }
  Tensor res = dst.dtype() == y.dtype() ? dst : empty(dst.shape(), y.dtype());
  with_float_type(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* d = static_cast<T*>(res.data_ptr());
#pragma omp parallel for collapse(2) if (outer * n * inner > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * n * inner + i;
        T acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += log ? gp[base + j * inner] : gp[base + j * inner] * yp[base + j * inner];
        for (int64_t j = 0; j < n; ++j) {
          const int64_t k = base + j * inner;
          d[k] = log ? gp[k] - std::exp(yp[k]) * acc : yp[k] * (gp[k] - acc);
        }
      }
    }
  });
  if (!res.is_same(dst)) copy(res, dst);
}

}  // namespace castor::kernels
