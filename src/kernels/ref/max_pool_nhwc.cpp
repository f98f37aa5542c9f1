// Max pooling of channels-last tensors as plain loops over each pixel's contiguous channels, in float: the reference
// the fast kernel (src/kernels/cpu/max_pool_nhwc.cpp) is tested against, and the kernel for windows too large for its
// one-byte argmax. Exact in every dtype (the result is one of the inputs).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "castor/convert.h"
#include "kernels/layers.h"

namespace castor::kernels {

namespace {

// The c channels at `at` as float: a pointer into the tensor for float32, else converted into buf.
const float* as_float(const char* at, DType dt, int64_t c, float* buf) {
  if (dt == DType::Float32) return reinterpret_cast<const float*>(at);
  convert(at, dt, buf, DType::Float32, c);
  return buf;
}

}  // namespace

Tensor max_pool2d_nhwc_forward_ref(const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  const int64_t n = src.size(0), c = src.size(1), h = src.size(2), w = src.size(3), oh = dst.size(2), ow = dst.size(3);
  const DType dt = src.dtype();
  const int64_t es = static_cast<int64_t>(src.element_size());
  const char* x = static_cast<const char*>(src.data_ptr());
  char* y = static_cast<char*>(dst.data_ptr());
  Tensor workspace = empty({n, oh, ow, c}, DType::Int32);  // argmax as iy * W + ix
  int32_t* argmax = workspace.data<int32_t>();
#pragma omp parallel
  {
    std::vector<float> in(c), best(c);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t out = ((b * oh + oy) * ow + ox) * c;  // (N, OH, OW, C) offset
          int32_t* arg = argmax + out;
          const int64_t y0 = oy * p.stride[0] - p.padding[0], x0 = ox * p.stride[1] - p.padding[1];
          bool first = true;
          for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y0 + p.kernel[0], h); ++iy)
            for (int64_t ix = std::max<int64_t>(x0, 0); ix < std::min(x0 + p.kernel[1], w); ++ix) {
              const int32_t pos = static_cast<int32_t>(iy * w + ix);
              const float* v = as_float(x + ((b * h + iy) * w + ix) * c * es, dt, c, in.data());
              if (first) {
                std::copy(v, v + c, best.data());
                std::fill(arg, arg + c, pos);
                first = false;
                continue;
              }
              // The first maximum wins; a NaN beats everything, like PyTorch (and the reference loops).
              for (int64_t ch = 0; ch < c; ++ch) {
                const bool take = v[ch] > best[ch] || (v[ch] != v[ch] && best[ch] == best[ch]);
                best[ch] = take ? v[ch] : best[ch];
                arg[ch] = take ? pos : arg[ch];
              }
            }
          convert(best.data(), DType::Float32, y + out * es, dt, c);
        }
  }
  return workspace;
}

void max_pool2d_nhwc_backward_ref(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src) {
  const int64_t n = diff_src.size(0), c = diff_src.size(1), h = diff_src.size(2), w = diff_src.size(3);
  const int64_t outputs = diff_dst.size(2) * diff_dst.size(3);  // per image
  const DType dt = diff_dst.dtype();
  const int64_t es = static_cast<int64_t>(diff_dst.element_size());
  const char* dy = static_cast<const char*>(diff_dst.data_ptr());
  char* dx = static_cast<char*>(diff_src.data_ptr());
  const int32_t* argmax = workspace.data<int32_t>();
#pragma omp parallel
  {
    std::vector<float> acc(h * w * c), g(c);  // one image's diff_src, accumulated in float and rounded once
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t o = 0; o < outputs; ++o) {
        const int64_t at = (b * outputs + o) * c;
        const float* gy = as_float(dy + at * es, dt, c, g.data());
        const int32_t* arg = argmax + at;
        for (int64_t ch = 0; ch < c; ++ch) acc[arg[ch] * c + ch] += gy[ch];
      }
      convert(acc.data(), DType::Float32, dx + b * h * w * c * es, dt, h * w * c);
    }
  }
}

}  // namespace castor::kernels
