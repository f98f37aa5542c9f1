// Fast max pooling of channels-last tensors: AVX2 loops over each pixel's contiguous channels that compare float32 as
// floats and 16-bit values as ordered integers on their raw bits (no conversion), and keep a one-byte argmax (the
// window position) per output; they match the reference loops (src/kernels/ref/max_pool_nhwc.cpp) bit for bit. The
// backward writes each diff_src element once where windows do not overlap (near memory bandwidth here).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "castor/convert.h"
#include "kernels/layers.h"

namespace castor::kernels {

namespace {

// The raw bits of one dtype: U the storage, K its signed twin, kMagnitude the non-sign bits, kInf +infinity's bits.
template <class U, U kInfBits>
struct Bits {
  using K = std::make_signed_t<U>;
  static constexpr U kMagnitude = static_cast<U>(static_cast<U>(~U{0}) >> 1);
  static constexpr U kInf = kInfBits;
  // A key whose signed order is the float order with -0 == +0 and every NaN above everything (and equal to every
  // other NaN), so that a strict `>` keeps the first maximum and lets a NaN win, like the reference loops.
  static K key(U v) {
    const U mag = v & kMagnitude;
    const K m = static_cast<K>(mag);
    return mag > kInf ? std::numeric_limits<K>::max() : (v == mag ? m : static_cast<K>(-m));
  }
  // g as the reference's float sum 0 + g gives it back: -0 becomes +0, everything else is itself.
  static U plus_zero(U g) { return (g & kMagnitude) == 0 ? U{0} : g; }
};
using Bf16Bits = Bits<uint16_t, 0x7f80>;
using F16Bits = Bits<uint16_t, 0x7c00>;
using F32Bits = Bits<uint32_t, 0x7f800000u>;

// AVX2 (the build's baseline, x86-64-v3) on the raw bits: 16 lanes of 16-bit or 8 of 32-bit values per register,
// one argmax byte per lane.
template <class U>
struct Simd;
template <>
struct Simd<uint16_t> {
  static constexpr int64_t kLanes = 16;
  static __m256i set1(uint16_t v) { return _mm256_set1_epi16(static_cast<int16_t>(v)); }
  // m negated where v is negative (v == 0 only where m is 0 too): one instruction.
  static __m256i signed_by(__m256i m, __m256i v) { return _mm256_sign_epi16(m, v); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi16(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi16(a, b); }
  static __m256i max(__m256i a, __m256i b) { return _mm256_max_epi16(a, b); }
  // Lanes holding 0..255 as one byte per lane (the low kLanes bytes).
  static __m128i narrow(__m256i m) {
    return _mm_packus_epi16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  }
  static __m128i load_arg(const uint8_t* a) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)); }
  static void store_arg(uint8_t* a, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(a), v); }
  static __m256i widen_arg(__m128i a) { return _mm256_cvtepu8_epi16(a); }
};
template <>
struct Simd<uint32_t> {
  static constexpr int64_t kLanes = 8;
  static __m256i set1(uint32_t v) { return _mm256_set1_epi32(static_cast<int32_t>(v)); }
  static __m256i signed_by(__m256i m, __m256i v) { return _mm256_sign_epi32(m, v); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi32(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(a, b); }
  static __m256i max(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
  static __m128i narrow(__m256i m) {
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    return _mm_packus_epi16(w, w);
  }
  static __m128i load_arg(const uint8_t* a) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)); }
  static void store_arg(uint8_t* a, __m128i v) { _mm_storel_epi64(reinterpret_cast<__m128i*>(a), v); }
  static __m256i widen_arg(__m128i a) { return _mm256_cvtepu8_epi32(a); }
};

// B::key on a register of lanes.
template <class B, class U = std::remove_const_t<decltype(B::kInf)>>
struct Keys {
  using S = Simd<U>;
  const __m256i magnitude = S::set1(B::kMagnitude), inf = S::set1(B::kInf),
                top = S::set1(static_cast<U>(std::numeric_limits<typename B::K>::max()));
  __m256i operator()(__m256i v) const {
    const __m256i mag = _mm256_and_si256(v, magnitude);
    return _mm256_blendv_epi8(S::signed_by(mag, v), top, S::gt(mag, inf));
  }
};

__m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
void store(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

// Output (b, oy, ox)'s window, clipped to the input: rows [y0, y1), columns [x0, x1); ky/kx offsets are from the
// unclipped window's corner (oy * stride - padding).
struct Window {
  int64_t y0, y1, x0, x1, corner_y, corner_x;
};
inline __attribute__((always_inline)) Window window(int64_t oy, int64_t ox, int64_t h, int64_t w,
                                                    const Pool2dParams& p) {
  const int64_t cy = oy * p.stride[0] - p.padding[0], cx = ox * p.stride[1] - p.padding[1];
  return {std::max<int64_t>(cy, 0),
          std::min(cy + p.kernel[0], h),
          std::max<int64_t>(cx, 0),
          std::min(cx + p.kernel[1], w),
          cy,
          cx};
}

// The workspace position of an output whose folded ReLU passes no gradient: no window position matches it.
constexpr int kNoGradient = 255;

// The window's in-bounds pixels of one output: their offsets into src and their positions ky * kw + kx.
struct Taps {
  int64_t offset[256];
  uint8_t pos[256];
  int count = 0;
};

// Max of `R` registers of channels from `ch` over the taps, into y and arg (at `out`), the registers kept across taps.
// Max of `R` registers of channels from `ch` over the taps, into y and arg (at `out`), the registers kept across taps.
// float32 compares as floats: take = !(v <= best) && best is not NaN, which is v > best, or v a NaN where best is
// not. 16-bit compares B::key.
// With `relu`: relu(max), -0 and NaN passing as relu's std::max(x, 0) does, and the position kNoGradient where
// relu's gradient (x > 0) is zero.
template <int R, class B, class U>
void max_registers(const U* x, const Taps& t, int64_t ch, U* y, uint8_t* arg, const Keys<B>& key, bool relu) {
  using S = Simd<U>;
  constexpr bool kFloat = std::is_same_v<U, uint32_t>;
  __m256i best[R], best_key[R], a[R];
  const __m256i pos0 = S::set1(t.pos[0]);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    best[r] = load(x + t.offset[0] + ch + r * S::kLanes);
    if constexpr (!kFloat) best_key[r] = key(best[r]);
    a[r] = pos0;
  }
  for (int i = 1; i < t.count; ++i) {
    const __m256i pos = S::set1(t.pos[i]);
    const U* v = x + t.offset[i] + ch;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i value = load(v + r * S::kLanes);
      __m256i take;
      if constexpr (kFloat) {
        const __m256 f = _mm256_castsi256_ps(value), b = _mm256_castsi256_ps(best[r]);
        take = _mm256_castps_si256(_mm256_and_ps(_mm256_cmp_ps(f, b, _CMP_NLE_UQ), _mm256_cmp_ps(b, b, _CMP_ORD_Q)));
      } else {
        const __m256i k = key(value);
        take = S::gt(k, best_key[r]);  // strictly greater: the first maximum stays
        best_key[r] = S::max(k, best_key[r]);
      }
      best[r] = _mm256_blendv_epi8(best[r], value, take);
      a[r] = _mm256_blendv_epi8(a[r], pos, take);
    }
  }
  if (relu) {
    const __m256i none = S::set1(kNoGradient), zero = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256i negative, positive;
      if constexpr (kFloat) {
        const __m256 b = _mm256_castsi256_ps(best[r]), z = _mm256_setzero_ps();
        negative = _mm256_castps_si256(_mm256_cmp_ps(b, z, _CMP_LT_OQ));
        positive = _mm256_castps_si256(_mm256_cmp_ps(b, z, _CMP_GT_OQ));
      } else {
        negative = S::gt(zero, best_key[r]);
        positive = _mm256_and_si256(S::gt(best_key[r], zero), S::gt(key.top, best_key[r]));  // NaN: not > 0
      }
      best[r] = _mm256_andnot_si256(negative, best[r]);
      a[r] = _mm256_blendv_epi8(none, a[r], positive);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    store(y + ch + r * S::kLanes, best[r]);
    S::store_arg(arg + ch + r * S::kLanes, S::narrow(a[r]));
  }
}

template <class B, class U = std::remove_const_t<decltype(B::kInf)>>
void forward(const U* x, U* y, uint8_t* arg, int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
             const Pool2dParams& p) {
  using S = Simd<U>;
  constexpr int64_t kMaxRegisters = 4;
  const Keys<B> key;
  // 2x2 windows at stride 2 that all lie inside the input (SimpleCNN's, VGG's): the four taps are fixed offsets from
  // the window's corner, so the per-output bookkeeping (clipping, tap lists, prefetches) that otherwise costs more
  // than the channel loop at 32-64 channels is skipped; the hardware prefetcher follows the two input rows.
  const bool two_by_two = p.kernel[0] == 2 && p.kernel[1] == 2 && p.stride[0] == 2 && p.stride[1] == 2 &&
                          p.padding[0] == 0 && p.padding[1] == 0 && 2 * oh <= h && 2 * ow <= w;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy) {
      Taps t;
      if (two_by_two) {
        t.count = 4;
        for (uint8_t i = 0; i < 4; ++i) t.pos[i] = i;  // ky * 2 + kx
      }
      for (int64_t ox = 0; ox < ow; ++ox) {
        const int64_t out = ((b * oh + oy) * ow + ox) * c;  // (N, OH, OW, C) offset
        if (two_by_two) {
          const int64_t corner = ((b * h + 2 * oy) * w + 2 * ox) * c;
          t.offset[0] = corner, t.offset[1] = corner + c;
          t.offset[2] = corner + w * c, t.offset[3] = corner + w * c + c;
        } else {
          const Window win = window(oy, ox, h, w, p);
          t.count = 0;
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) {
              t.offset[t.count] = ((b * h + iy) * w + ix) * c;
              t.pos[t.count++] = static_cast<uint8_t>((iy - win.corner_y) * p.kernel[1] + (ix - win.corner_x));
            }
          for (int i = 0; i < t.count; ++i)  // the window after next: the loads here wait on memory otherwise
            for (int64_t line = 0; line < c * int64_t{sizeof(U)}; line += 64)
              _mm_prefetch(reinterpret_cast<const char*>(x + t.offset[i] + 2 * p.stride[1] * c) + line, _MM_HINT_T0);
        }
        int64_t ch = 0;
        for (; ch + S::kLanes <= c;) {
          const int64_t regs = std::min(kMaxRegisters, (c - ch) / S::kLanes);
          switch (regs) {
            case 4: max_registers<4>(x, t, ch, y + out, arg + out, key, p.relu); break;
            case 3: max_registers<3>(x, t, ch, y + out, arg + out, key, p.relu); break;
            case 2: max_registers<2>(x, t, ch, y + out, arg + out, key, p.relu); break;
            default: max_registers<1>(x, t, ch, y + out, arg + out, key, p.relu); break;
          }
          ch += regs * S::kLanes;
        }
        for (; ch < c; ++ch) {  // the channels past the last full register
          typename B::K best_key = B::key(x[t.offset[0] + ch]);
          y[out + ch] = x[t.offset[0] + ch], arg[out + ch] = t.pos[0];
          for (int i = 1; i < t.count; ++i) {
            const typename B::K k = B::key(x[t.offset[i] + ch]);
            if (k > best_key) y[out + ch] = x[t.offset[i] + ch], arg[out + ch] = t.pos[i], best_key = k;
          }
          if (p.relu) {
            if (best_key < 0) y[out + ch] = U{0};
            if (!(best_key > 0 && best_key < std::numeric_limits<typename B::K>::max())) arg[out + ch] = kNoGradient;
          }
        }
      }
    }
}

// Windows that do not overlap (stride >= kernel): each input takes at most one output's gradient, so every diff_src
// element is written once, in place, without an accumulator.
template <class B, class U = std::remove_const_t<decltype(B::kInf)>>
void backward_disjoint(const U* dy, const uint8_t* arg, U* dx, int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                       int64_t ow, const Pool2dParams& p) {
  using S = Simd<U>;
  const __m256i magnitude = S::set1(B::kMagnitude), zero = _mm256_setzero_si256();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t iy = 0; iy < h; ++iy) {
      const int64_t oy = (iy + p.padding[0]) / p.stride[0], ky = (iy + p.padding[0]) % p.stride[0];
      const bool row = ky < p.kernel[0] && oy < oh;
      for (int64_t ix = 0; ix < w; ++ix) {
        U* d = dx + ((b * h + iy) * w + ix) * c;
        const int64_t ox = (ix + p.padding[1]) / p.stride[1], kx = (ix + p.padding[1]) % p.stride[1];
        if (!row || kx >= p.kernel[1] || ox >= ow) {
          std::memset(d, 0, c * sizeof(U));
          continue;
        }
        const int64_t at = ((b * oh + oy) * ow + ox) * c;
        const U* g = dy + at;
        const uint8_t* a = arg + at;
        const auto pos = static_cast<uint8_t>(ky * p.kernel[1] + kx);
        const __m256i pos_v = S::set1(pos);
        int64_t ch = 0;
        for (; ch + S::kLanes <= c; ch += S::kLanes) {
          const __m256i gv = load(g + ch);
          const __m256i mine = S::eq(S::widen_arg(S::load_arg(a + ch)), pos_v);
          const __m256i is_zero = S::eq(_mm256_and_si256(gv, magnitude), zero);
          store(d + ch, _mm256_and_si256(mine, _mm256_andnot_si256(is_zero, gv)));
        }
        for (; ch < c; ++ch) d[ch] = a[ch] == pos ? B::plus_zero(g[ch]) : U{0};
      }
    }
}

// Overlapping windows: one image's gradient summed in float32 in the reference's order (output by output) and
// rounded once; adding +0 where a window position is not the argmax changes nothing.
void backward_overlapping(const char* dy, DType dt, const uint8_t* arg, char* dx, int64_t n, int64_t c, int64_t h,
                          int64_t w, int64_t oh, int64_t ow, const Pool2dParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
#pragma omp parallel
  {
    std::vector<float> acc(h * w * c), buf(c);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t at = ((b * oh + oy) * ow + ox) * c;
          const float* __restrict g = reinterpret_cast<const float*>(dy + at * es);
          if (dt != DType::Float32) {
            convert(dy + at * es, dt, buf.data(), DType::Float32, c);
            g = buf.data();
          }
          const uint8_t* __restrict a = arg + at;
          const Window win = window(oy, ox, h, w, p);
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) {
              float* __restrict s = acc.data() + (iy * w + ix) * c;
              const auto pos = static_cast<uint8_t>((iy - win.corner_y) * p.kernel[1] + (ix - win.corner_x));
              for (int64_t ch = 0; ch < c; ++ch) s[ch] += a[ch] == pos ? g[ch] : 0.0f;
            }
        }
      convert(acc.data(), DType::Float32, dx + b * h * w * c * es, dt, h * w * c);
    }
  }
}

// Calls f with the Bits of dt (float32, bfloat16, float16).
template <class F>
void with_bits(DType dt, F f) {
  switch (dt) {
    case DType::Float32: return f(F32Bits{});
    case DType::BFloat16: return f(Bf16Bits{});
    case DType::Float16: return f(F16Bits{});
    default: CASTOR_ASSERT(false, "max_pool2d_nhwc: no fast kernel for ", dtype_name(dt));
  }
}

}  // namespace

bool max_pool2d_nhwc_fits(const Pool2dParams& p) {
  return p.is_max && p.kernel[0] * p.kernel[1] <= (p.relu ? kNoGradient : 256);
}

Tensor max_pool2d_nhwc_forward(const Tensor& src, const Tensor& dst, const Pool2dParams& p) {
  // the argmax's position in its window, ky * kw + kx
  Tensor workspace = empty({dst.size(0), dst.size(2), dst.size(3), dst.size(1)}, DType::UInt8);
  max_pool2d_nhwc_forward_into(src, dst, workspace, p);
  return workspace;
}

void max_pool2d_nhwc_forward_into(const Tensor& src, const Tensor& dst, const Tensor& workspace,
                                  const Pool2dParams& p) {
  CASTOR_ASSERT(max_pool2d_nhwc_fits(p), "max_pool2d_nhwc_forward: a window of more than 256 positions");
  const int64_t n = src.size(0), c = src.size(1), h = src.size(2), w = src.size(3), oh = dst.size(2), ow = dst.size(3);
  CASTOR_ASSERT(workspace.dtype() == DType::UInt8 && workspace.numel() == n * oh * ow * c && workspace.is_contiguous(),
                "max_pool2d_nhwc_forward: workspace ", workspace.describe());
  with_bits(src.dtype(), [&](auto bits) {
    using B = decltype(bits);
    using U = std::remove_const_t<decltype(B::kInf)>;
    forward<B>(static_cast<const U*>(src.data_ptr()), static_cast<U*>(dst.data_ptr()), workspace.data<uint8_t>(), n, c,
               h, w, oh, ow, p);
  });
}

void max_pool2d_nhwc_backward(const Tensor& diff_dst, const Tensor& workspace, const Tensor& diff_src,
                              const Pool2dParams& p) {
  const int64_t n = diff_src.size(0), c = diff_src.size(1), h = diff_src.size(2), w = diff_src.size(3);
  const int64_t oh = diff_dst.size(2), ow = diff_dst.size(3);
  const uint8_t* arg = workspace.data<uint8_t>();
  if (p.stride[0] < p.kernel[0] || p.stride[1] < p.kernel[1]) {
    backward_overlapping(static_cast<const char*>(diff_dst.data_ptr()), diff_dst.dtype(), arg,
                         static_cast<char*>(diff_src.data_ptr()), n, c, h, w, oh, ow, p);
    return;
  }
  with_bits(diff_dst.dtype(), [&](auto bits) {
    using B = decltype(bits);
    using U = std::remove_const_t<decltype(B::kInf)>;
    backward_disjoint<B>(static_cast<const U*>(diff_dst.data_ptr()), arg, static_cast<U*>(diff_src.data_ptr()), n, c, h,
                         w, oh, ow, p);
  });
}

}  // namespace castor::kernels
