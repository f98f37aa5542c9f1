// Fused cross-entropy over large vocabularies: each row read once per pass in L1-sized float32 chunks (an online
// log-sum-exp forward, a one-pass backward that writes the rounded gradient), AVX2 exp, rows over the threads.
#include <cmath>
#include <limits>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ref/transformer_util.h"
#include "kernels/transformer.h"

namespace castor::kernels {

namespace {

constexpr int64_t kChunk = kBlock;  // float32 values of a row held at once (8 KiB)

const char* row_ptr(const Tensor& t, int64_t i, int64_t j) {
  return static_cast<const char*>(t.data_ptr()) + (i * t.size(1) + j) * t.element_size();
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                           const Tensor& losses, const Tensor& lse) {
  if (logits.dtype() == DType::Float64)
    return cross_entropy_forward_ref(logits, target, ignore_index, label_smoothing, losses, lse);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_targets(target, V, ignore_index);
  const int64_t* t = target.data<int64_t>();
  float *loss = losses.data<float>(), *lz = lse.data<float>();
  const float eps = static_cast<float>(label_smoothing);
  const DType dt = logits.dtype();
#pragma omp parallel for schedule(static) if (N * V > kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    alignas(32) float x[kChunk];
    float m = -std::numeric_limits<float>::infinity(), z = 0, sum = 0, xt = 0;
    for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
      const int64_t n = std::min(kChunk, V - j0);
      convert(row_ptr(logits, i, j0), dt, x, DType::Float32, n);
      if (t[i] >= j0 && t[i] < j0 + n) xt = x[t[i] - j0];
      if (eps != 0) {
        __m256 acc = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + j));
        float s = vec::hsum(acc);
        for (; j < n; ++j) s += x[j];
        sum += s;
      }
      const float cm = vec::max(x, n);
      if (cm > m) {
        z *= std::exp(m - cm);  // rescale the running sum to the new maximum
        m = cm;
      }
      if (m != -std::numeric_limits<float>::infinity()) z += vec::exp_shifted(x, n, m);
    }
    const float l = m + std::log(z);
    lz[i] = l;
    loss[i] = t[i] == ignore_index ? 0.0f : (1 - eps) * (l - xt) + eps * (l - sum / static_cast<float>(V));
  }
}

void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& diff_losses,
                            int64_t ignore_index, double label_smoothing, const Tensor& diff_logits) {
  if (logits.dtype() == DType::Float64)
    return cross_entropy_backward_ref(logits, target, lse, diff_losses, ignore_index, label_smoothing, diff_logits);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_targets(target, V, ignore_index);
  const int64_t* t = target.data<int64_t>();
  const float *lz = lse.data<float>(), *g = diff_losses.data<float>();
  const float eps = static_cast<float>(label_smoothing), off = eps / static_cast<float>(V);
  const DType dt = logits.dtype();
#pragma omp parallel for schedule(static) if (N * V > kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    alignas(32) float x[kChunk];
    const bool ignored = t[i] == ignore_index;
    const __m256 gi = _mm256_set1_ps(ignored ? 0.0f : g[i]), l = _mm256_set1_ps(lz[i]), o = _mm256_set1_ps(off);
    for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
      const int64_t n = std::min(kChunk, V - j0);
      char* out = const_cast<char*>(row_ptr(diff_logits, i, j0));
      if (ignored) {
        std::fill(x, x + n, 0.0f);
      } else {
        convert(row_ptr(logits, i, j0), dt, x, DType::Float32, n);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
          const __m256 p = vec::exp(_mm256_sub_ps(_mm256_loadu_ps(x + j), l));
          _mm256_storeu_ps(x + j, _mm256_mul_ps(gi, _mm256_sub_ps(p, o)));
        }
        for (; j < n; ++j) x[j] = g[i] * (std::exp(x[j] - lz[i]) - off);
        if (t[i] >= j0 && t[i] < j0 + n) x[t[i] - j0] -= g[i] * (1 - eps);
      }
      convert(x, DType::Float32, out, dt, n);
    }
  }
}

}  // namespace castor::kernels
