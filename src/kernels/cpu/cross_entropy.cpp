// Fused cross-entropy over large vocabularies: each row read once per pass, 16-bit logits in L1-sized float32 chunks
// (an online log-sum-exp forward, a one-pass backward that writes the rounded gradient), AVX2 or AVX-512 exp chosen
// at run time, rows over the threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "castor/convert.h"
#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ref/loops.h"
#include "kernels/kernels.h"
#include "kernels/ref/transformer_util.h"
#include "kernels/transformer.h"

namespace castor::kernels {

namespace {

constexpr int64_t kChunk = kBlock;  // float32 values of a row held at once (8 KiB)

// The row kernels of one instruction set.
struct RowOps {
  float (*max)(const float* x, int64_t n);
  float (*sum_exp)(const float* x, int64_t n, float shift);
  void (*softmax_grad)(const float* x, int64_t n, float lse, float g, float off, float* out);
};

const RowOps& row_ops() {
  static const RowOps avx2{vec::max, vec::sum_exp_avx2, vec::softmax_grad_avx2};
  static const RowOps avx512{vec::max_avx512, vec::sum_exp_avx512, vec::softmax_grad_avx512};
  // The conversion kernels' choice honours ONEDNN_MAX_CPU_ISA, as every Castor kernel does.
  return avx512_kernels() ? avx512 : avx2;
}

// Element (i, j) of a (N, V) tensor with unit column stride (rows may be strided).
char* elem(const Tensor& t, int64_t i, int64_t j) {
  return static_cast<char*>(t.data_ptr()) + (i * t.stride(0) + j) * t.element_size();
}

// Calls f(x, j0, n) over chunks of row i of logits as float32: pointers into a float32 tensor, else converted.
template <class F>
void for_chunks(const Tensor& logits, int64_t i, float* buf, F f) {
  const int64_t V = logits.size(1);
  const bool direct = logits.dtype() == DType::Float32;
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t n = std::min(kChunk, V - j0);
    const float* x = direct ? reinterpret_cast<const float*>(elem(logits, i, j0)) : buf;
    if (!direct) convert(elem(logits, i, j0), logits.dtype(), buf, DType::Float32, n);
    f(x, j0, n);
  }
}

// The running statistics of row i folded with its logits (x, one row of `logits` from class first_class on): the
// maximum m, the sum z of exp(x - m) (rescaled when m grows), the target's logit xt if it is in the block, and with
// label smoothing the logits' sum, over chunks of kChunk columns.
void fold_rows(const Tensor& logits, const Tensor& target, int64_t first_class, bool smoothing, float* state) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t* t = target.data<int64_t>();
  const RowOps& ops = row_ops();
#pragma omp parallel for schedule(static) if (N * V > kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    alignas(64) float buf[kChunk];
    float &m = state[4 * i], &z = state[4 * i + 1], &xt = state[4 * i + 2], &sum = state[4 * i + 3];
    const int64_t ti = t[i] - first_class;
    for_chunks(logits, i, buf, [&](const float* x, int64_t j0, int64_t n) {
      if (ti >= j0 && ti < j0 + n) xt = x[ti - j0];
      if (smoothing) {
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += x[j];
        sum += s;
      }
      const float cm = ops.max(x, n);
      if (cm > m) {
        z *= std::exp(m - cm);  // the running sum rescaled to the new maximum
        m = cm;
      }
      if (m != -std::numeric_limits<float>::infinity()) z += ops.sum_exp(x, n, m);
    });
  }
}

// The float64 fold: the same running statistics in double, a value at a time.
void fold_rows_f64(const Tensor& logits, const Tensor& target, int64_t first_class, double* state) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < N; ++i) {
    const double* x = reinterpret_cast<const double*>(elem(logits, i, 0));
    double &m = state[4 * i], &z = state[4 * i + 1], &xt = state[4 * i + 2], &sum = state[4 * i + 3];
    const int64_t ti = t[i] - first_class;
    if (ti >= 0 && ti < V) xt = x[ti];
    for (int64_t j = 0; j < V; ++j) {
      sum += x[j];
      if (x[j] > m) {
        z *= std::exp(m - x[j]);
        m = x[j];
      }
      if (m != -std::numeric_limits<double>::infinity()) z += std::exp(x[j] - m);
    }
  }
}

// losses and lse of each row from its statistics over `classes` classes.
template <class T>
void finish_rows(const T* state, const Tensor& target, int64_t ignore_index, T eps, int64_t classes, T* loss, T* lz) {
  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < target.size(0); ++i) {
    const T m = state[4 * i], z = state[4 * i + 1], xt = state[4 * i + 2], sum = state[4 * i + 3];
    const T l = m + std::log(z);
    lz[i] = l;
    loss[i] = t[i] == ignore_index ? T(0) : (1 - eps) * (l - xt) + eps * (l - sum / static_cast<T>(classes));
  }
}

}  // namespace

Tensor cross_entropy_state(int64_t rows, DType stat) {
  Tensor state = empty({rows, 4}, stat);
  with_compute_type(stat, [&](auto tag) {
    using T = decltype(tag);
    T* s = static_cast<T*>(state.data_ptr());
    for (int64_t i = 0; i < rows; ++i)
      s[4 * i] = -std::numeric_limits<T>::infinity(), s[4 * i + 1] = s[4 * i + 2] = s[4 * i + 3] = 0;
  });
  return state;
}

void cross_entropy_forward_block(const Tensor& logits, const Tensor& target, int64_t first_class,
                                 double label_smoothing, const Tensor& state) {
  if (logits.dtype() == DType::Float64) return fold_rows_f64(logits, target, first_class, state.data<double>());
  fold_rows(logits, target, first_class, label_smoothing != 0, state.data<float>());
}

void cross_entropy_forward_finish(const Tensor& state, const Tensor& target, int64_t ignore_index,
                                  double label_smoothing, int64_t classes, const Tensor& losses, const Tensor& lse) {
  check_targets(target, classes, ignore_index);
  with_compute_type(state.dtype(), [&](auto tag) {
    using T = decltype(tag);
    finish_rows<T>(static_cast<const T*>(state.data_ptr()), target, ignore_index, static_cast<T>(label_smoothing),
                   classes, static_cast<T*>(losses.data_ptr()), static_cast<T*>(lse.data_ptr()));
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                           const Tensor& losses, const Tensor& lse) {
  if (logits.dtype() == DType::Float64)
    return cross_entropy_forward_ref(logits, target, ignore_index, label_smoothing, losses, lse);
  check_targets(target, logits.size(1), ignore_index);
  const Tensor state = cross_entropy_state(logits.size(0), DType::Float32);
  cross_entropy_forward_block(logits, target, 0, label_smoothing, state);
  cross_entropy_forward_finish(state, target, ignore_index, label_smoothing, logits.size(1), losses, lse);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& diff_losses,
                            int64_t ignore_index, double label_smoothing, const Tensor& diff_logits,
                            int64_t first_class, int64_t classes) {
  if (logits.dtype() == DType::Float64)
    return cross_entropy_backward_ref(logits, target, lse, diff_losses, ignore_index, label_smoothing, diff_logits,
                                      first_class, classes);
  const int64_t N = logits.size(0), V = logits.size(1), K = classes > 0 ? classes : V;
  check_targets(target, K, ignore_index);
  const int64_t* t = target.data<int64_t>();
  const float *lz = lse.data<float>(), *g = diff_losses.data<float>();
  const float eps = static_cast<float>(label_smoothing), off = eps / static_cast<float>(K);
  const DType dt = logits.dtype();
  const bool direct = dt == DType::Float32;
  const RowOps& ops = row_ops();
#pragma omp parallel for schedule(static) if (N * V > kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    alignas(64) float buf[kChunk], out[kChunk];
    if (t[i] == ignore_index) {
      std::fill(out, out + std::min(kChunk, V), 0.0f);
      for (int64_t j0 = 0; j0 < V; j0 += kChunk)
        convert(out, DType::Float32, elem(diff_logits, i, j0), dt, std::min(kChunk, V - j0));
      continue;
    }
    for_chunks(logits, i, buf, [&](const float* x, int64_t j0, int64_t n) {
      float* o = direct ? reinterpret_cast<float*>(elem(diff_logits, i, j0)) : out;
      ops.softmax_grad(x, n, lz[i], g[i], off, o);
      const int64_t ti = t[i] - first_class;  // the target's column in this block, if it is in it
      if (ti >= j0 && ti < j0 + n) o[ti - j0] -= g[i] * (1 - eps);
      if (!direct) convert(out, DType::Float32, elem(diff_logits, i, j0), dt, n);
    });
  }
}

void linear_cross_entropy_forward(const Tensor& x, const WeightRows& rows, const Tensor& target, int64_t classes,
                                  int64_t chunk, int64_t ignore_index, double label_smoothing, const Tensor& losses,
                                  const Tensor& lse) {
  // All rows' logits a block of classes at a time (as the backward), each row's log-sum-exp carried from block to
  // block: blocks of rows made thin products that streamed the whole (V, C) weight once per block. Blocks of whole
  // kBlock columns where the budget allows give the bits of the cross-entropy of whole rows.
  const int64_t N = x.size(0), cols = std::max<int64_t>(1, chunk / std::max<int64_t>(N, 1));
  const int64_t width = cols >= kBlock ? cols / kBlock * kBlock : cols;
  const Tensor state = cross_entropy_state(N, losses.dtype());
  for (int64_t c0 = 0; c0 < classes; c0 += width) {
    const int64_t n = std::min(width, classes - c0);
    Tensor logits = empty({N, n}, x.dtype());  // (N, n), rounded once as linear's
    matmul(x, rows(c0, n).transpose(0, 1), logits);
    cross_entropy_forward_block(logits, target, c0, label_smoothing, state);
  }
  cross_entropy_forward_finish(state, target, ignore_index, label_smoothing, classes, losses, lse);
}

void linear_cross_entropy_backward(const Tensor& x, const WeightRows& rows, const Tensor& target, const Tensor& lse,
                                   const Tensor& diff_losses, int64_t classes, int64_t chunk, int64_t ignore_index,
                                   double label_smoothing, const Tensor& diff_w, const Tensor& diff_x) {
  const int64_t N = x.size(0), cols = std::max<int64_t>(1, chunk / std::max<int64_t>(N, 1));
  for (int64_t c0 = 0; c0 < classes; c0 += cols) {
    const int64_t n = std::min(cols, classes - c0);
    const Tensor wb = rows(c0, n);  // (n, C)
    Tensor logits = empty({N, n}, x.dtype()), diff_logits = empty({N, n}, x.dtype());
    matmul(x, wb.transpose(0, 1), logits);
    cross_entropy_backward(logits, target, lse, diff_losses, ignore_index, label_smoothing, diff_logits, c0, classes);
    if (diff_w.defined()) matmul(diff_logits.transpose(0, 1), x, diff_w.narrow(0, c0, n));
    if (diff_x.defined()) matmul_add(diff_logits, wb, diff_x);  // exact products, float32 sums
  }
}

}  // namespace castor::kernels
