// Reference loops for convolution, batch norm and pooling in float64: the float64 path and the tests' oracle.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/layers.h"

namespace castor::kernels {

namespace {

// A contiguous float64 tensor's elements (null for an undefined tensor).
double* ptr(const Tensor& t) { return t.defined() ? t.data<double>() : nullptr; }

// The (N, C, H, W) sizes of a 4-D tensor.
struct Dims4 {
  int64_t n, c, h, w;
  explicit Dims4(const Tensor& t) : n(t.size(0)), c(t.size(1)), h(t.size(2)), w(t.size(3)) {}
};

// Calls f(n, o, oy, ox, g_c, ky, kx, iy, ix) for every in-bounds (output, input, weight) triple of a convolution.
template <class F>
void conv_taps(const Dims4& s, const Dims4& d, const Dims4& wt, const Conv2dParams& p, F f) {
  const int64_t out_per_group = d.c / p.groups;
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t o = 0; o < d.c; ++o) {
      const int64_t g = o / out_per_group;
      for (int64_t oy = 0; oy < d.h; ++oy)
        for (int64_t ox = 0; ox < d.w; ++ox)
          for (int64_t ci = 0; ci < wt.c; ++ci)
            for (int64_t ky = 0; ky < wt.h; ++ky) {
              const int64_t iy = oy * p.stride[0] - p.padding[0] + ky * p.dilation[0];
              if (iy < 0 || iy >= s.h) continue;
              for (int64_t kx = 0; kx < wt.w; ++kx) {
                const int64_t ix = ox * p.stride[1] - p.padding[1] + kx * p.dilation[1];
                if (ix < 0 || ix >= s.w) continue;
                f(((n * d.c + o) * d.h + oy) * d.w + ox, ((n * s.c + g * wt.c + ci) * s.h + iy) * s.w + ix,
                  ((o * wt.c + ci) * wt.h + ky) * wt.w + kx);
              }
            }
    }
}

}  // namespace

void conv2d_forward_ref(const Tensor& src, const Tensor& weights, const Tensor& bias, const Tensor& dst,
                        const Conv2dParams& p) {
  const Dims4 s(src), d(dst), wt(weights);
  const double *x = ptr(src), *w = ptr(weights), *b = ptr(bias);
  double* y = ptr(dst);
  const int64_t plane = d.h * d.w;
  for (int64_t i = 0; i < dst.numel(); ++i) y[i] = b ? b[(i / plane) % d.c] : 0.0;
  conv_taps(s, d, wt, p, [&](int64_t yi, int64_t xi, int64_t wi) { y[yi] += x[xi] * w[wi]; });
}

void conv2d_backward_ref(const Tensor& src, const Tensor& weights, const Tensor& diff_dst, const Tensor& diff_src,
                         const Tensor& diff_weights, const Tensor& diff_bias, const Conv2dParams& p) {
  const Dims4 s(diff_src.defined() ? diff_src : src), d(diff_dst), wt(diff_weights.defined() ? diff_weights : weights);
  const double *x = ptr(src), *w = ptr(weights), *dy = ptr(diff_dst);
  double *dx = ptr(diff_src), *dw = ptr(diff_weights), *db = ptr(diff_bias);
  if (dx) std::fill(dx, dx + diff_src.numel(), 0.0);
  if (dw) std::fill(dw, dw + diff_weights.numel(), 0.0);
  if (dx || dw)
    conv_taps(s, d, wt, p, [&](int64_t yi, int64_t xi, int64_t wi) {
      if (dx) dx[xi] += dy[yi] * w[wi];
      if (dw) dw[wi] += dy[yi] * x[xi];
    });
  if (db) {
    std::fill(db, db + d.c, 0.0);
    const int64_t plane = d.h * d.w;
    for (int64_t i = 0; i < diff_dst.numel(); ++i) db[(i / plane) % d.c] += dy[i];
  }
}

void batch_norm_forward_ref(const Tensor& src, const Tensor& scale, const Tensor& shift, const Tensor& mean,
                            const Tensor& var, const Tensor& dst, double eps, bool training) {
  const Dims4 s(src);
  const int64_t plane = s.h * s.w, count = s.n * plane;
  const double *x = ptr(src), *gamma = ptr(scale), *beta = ptr(shift);
  double *mu = ptr(mean), *sigma2 = ptr(var), *y = ptr(dst);
  for (int64_t c = 0; c < s.c; ++c) {
    auto at = [&](int64_t n, int64_t i) { return (n * s.c + c) * plane + i; };
    if (training) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t i = 0; i < plane; ++i) sum += x[at(n, i)];
      mu[c] = sum / count;
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t i = 0; i < plane; ++i) sq += (x[at(n, i)] - mu[c]) * (x[at(n, i)] - mu[c]);
      sigma2[c] = sq / count;
    }
    const double inv_std = 1.0 / std::sqrt(sigma2[c] + eps);
    const double a = (gamma ? gamma[c] : 1.0) * inv_std, b = beta ? beta[c] : 0.0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < plane; ++i) y[at(n, i)] = (x[at(n, i)] - mu[c]) * a + b;
  }
}

void batch_norm_backward_ref(const Tensor& src, const Tensor& diff_dst, const Tensor& scale, const Tensor& shift,
                             const Tensor& mean, const Tensor& var, const Tensor& diff_src, const Tensor& diff_scale,
                             const Tensor& diff_shift, double eps, bool training) {
  const Dims4 s(src);
  const int64_t plane = s.h * s.w, count = s.n * plane;
  const double *x = ptr(src), *dy = ptr(diff_dst), *gamma = ptr(scale), *mu = ptr(mean), *sigma2 = ptr(var);
  double *dx = ptr(diff_src), *dgamma = ptr(diff_scale), *dbeta = ptr(diff_shift);
  for (int64_t c = 0; c < s.c; ++c) {
    auto at = [&](int64_t n, int64_t i) { return (n * s.c + c) * plane + i; };
    const double inv_std = 1.0 / std::sqrt(sigma2[c] + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < plane; ++i) {
        sum_dy += dy[at(n, i)];
        sum_dy_xhat += dy[at(n, i)] * (x[at(n, i)] - mu[c]) * inv_std;
      }
    if (dgamma) dgamma[c] = sum_dy_xhat;
    if (dbeta) dbeta[c] = sum_dy;
    if (!dx) continue;
    const double g = gamma ? gamma[c] : 1.0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < plane; ++i) {
        const double xhat = (x[at(n, i)] - mu[c]) * inv_std;
        const double centered = training ? dy[at(n, i)] - sum_dy / count - xhat * sum_dy_xhat / count : dy[at(n, i)];
        dx[at(n, i)] = g * inv_std * centered;
      }
  }
}

namespace {

// One pooling window: its in-bounds input rows and columns, and the divisor average pooling uses.
struct Window {
  int64_t y0, y1, x0, x1;  // in-bounds input rows [y0, y1) and columns [x0, x1)
  int64_t divisor;
};

// Calls f(n * C + c, dst_index, window) for each output of a pooling.
template <class F>
void pool_windows(const Dims4& s, const Dims4& d, const Pool2dParams& p, F f) {
  for (int64_t nc = 0; nc < d.n * d.c; ++nc)
    for (int64_t oy = 0; oy < d.h; ++oy)
      for (int64_t ox = 0; ox < d.w; ++ox) {
        const int64_t ys = oy * p.stride[0] - p.padding[0], xs = ox * p.stride[1] - p.padding[1];
        Window w{std::max<int64_t>(ys, 0), std::min(ys + p.kernel[0], s.h), std::max<int64_t>(xs, 0),
                 std::min(xs + p.kernel[1], s.w), 0};
        w.divisor = p.count_include_pad ? p.kernel[0] * p.kernel[1] : (w.y1 - w.y0) * (w.x1 - w.x0);
        f(nc, (nc * d.h + oy) * d.w + ox, w);
      }
}

}  // namespace

Tensor pool2d_forward_ref(const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  const Dims4 s(src), d(dst);
  const double* x = ptr(src);
  double* y = ptr(dst);
  Tensor argmax = p.is_max ? empty(dst.shape(), DType::Int64) : Tensor();
  int64_t* am = p.is_max ? argmax.data<int64_t>() : nullptr;
  const int64_t plane = s.h * s.w;
  pool_windows(s, d, p, [&](int64_t nc, int64_t yi, const Window& w) {
    double acc = p.is_max ? -std::numeric_limits<double>::infinity() : 0.0;
    int64_t best = -1;
    for (int64_t iy = w.y0; iy < w.y1; ++iy)
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const int64_t xi = nc * plane + iy * s.w + ix;
        if (!p.is_max) {
          acc += x[xi];
        } else if (best < 0 || x[xi] > acc || (std::isnan(x[xi]) && !std::isnan(acc))) {
          acc = x[xi];  // the first maximum wins; a NaN beats everything, like PyTorch
          best = xi;
        }
      }
    y[yi] = p.is_max ? acc : acc / w.divisor;
    if (am) am[yi] = best;
  });
  return argmax;
}

void pool2d_backward_ref(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src,
                         const Pool2dParams& p) {
  const Dims4 s(diff_src), d(diff_dst);
  const double* dy = ptr(diff_dst);
  double* dx = ptr(diff_src);
  std::fill(dx, dx + diff_src.numel(), 0.0);
  if (p.is_max) {
    const int64_t* am = workspace.data<int64_t>();
    for (int64_t i = 0; i < diff_dst.numel(); ++i) dx[am[i]] += dy[i];
    return;
  }
  const int64_t plane = s.h * s.w;
  pool_windows(s, d, p, [&](int64_t nc, int64_t yi, const Window& w) {
    for (int64_t iy = w.y0; iy < w.y1; ++iy)
      for (int64_t ix = w.x0; ix < w.x1; ++ix) dx[nc * plane + iy * s.w + ix] += dy[yi] / w.divisor;
  });
}

}  // namespace castor::kernels
