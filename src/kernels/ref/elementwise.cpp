// Element-wise kernels: strided copy/convert, fill, unary and binary maps, comparisons, where.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "castor/convert.h"
#include "kernels/cpu/gelu.h"
#include "kernels/kernels.h"
#include "kernels/ref/loops.h"

namespace castor::kernels {

// ---- copy ----

namespace {

// Collapses dims that are contiguous in both src and dst, and drops size-1 dims.
struct Layout {
  Shape shape, src_strides, dst_strides;
};

Layout collapse(const Tensor& src, const Tensor& dst) {
  Layout l;
  for (int64_t d = 0; d < dst.dim(); ++d) {
    if (dst.shape()[d] == 1) continue;
    int64_t n = dst.shape()[d], ss = src.strides()[d], ds = dst.strides()[d];
    if (!l.shape.empty() && l.src_strides.back() == ss * n && l.dst_strides.back() == ds * n) {
      l.shape.back() *= n;
      l.src_strides.back() = ss;
      l.dst_strides.back() = ds;
    } else {
      l.shape.push_back(n);
      l.src_strides.push_back(ss);
      l.dst_strides.push_back(ds);
    }
  }
  if (l.shape.empty()) l = {{1}, {1}, {1}};
  return l;
}

template <class W>
void strided_copy(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t n) {
  const W* s = reinterpret_cast<const W*>(src);
  W* d = reinterpret_cast<W*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i * dst_stride] = s[i * src_stride];
}

}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  CASTOR_ASSERT(src.shape() == dst.shape(), "copy of ", src.describe(), " into ", dst.describe());
  if (dst.numel() == 0) return;
  const Layout l = collapse(src, dst);
  const int64_t nd = static_cast<int64_t>(l.shape.size());
  const int64_t inner = l.shape.back(), s_in = l.src_strides.back(), d_in = l.dst_strides.back();
  const int64_t rows = dst.numel() / inner;
  const size_t ss = src.element_size(), ds = dst.element_size();
  const char* sp = static_cast<const char*>(src.data_ptr());
  char* dp = static_cast<char*>(dst.data_ptr());
  const DType sd = src.dtype(), dd = dst.dtype();
  // One dense run (or two dense tensors laid out alike, channels-last ones say): split it across threads.
  if ((nd == 1 && s_in == 1 && d_in == 1) || same_layout(src, dst)) {
    parallel_blocks(dst.numel(), [&](int64_t b, int64_t e) { convert(sp + b * ss, sd, dp + b * ds, dd, e - b); });
    return;
  }
#pragma omp parallel for if (dst.numel() > (1 << 16)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t so = 0, dof = 0, rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      int64_t i = rem % l.shape[d];
      rem /= l.shape[d];
      so += i * l.src_strides[d];
      dof += i * l.dst_strides[d];
    }
    const char* s = sp + so * static_cast<int64_t>(ss);
    char* o = dp + dof * static_cast<int64_t>(ds);
    if (s_in == 1 && d_in == 1) {
      convert(s, sd, o, dd, inner);
    } else if (sd == dd) {
      switch (ss) {
        case 1: strided_copy<uint8_t>(s, s_in, o, d_in, inner); break;
        case 2: strided_copy<uint16_t>(s, s_in, o, d_in, inner); break;
        case 4: strided_copy<uint32_t>(s, s_in, o, d_in, inner); break;
        default: strided_copy<uint64_t>(s, s_in, o, d_in, inner); break;
      }
    } else {
      for (int64_t i = 0; i < inner; ++i) convert(s + i * s_in * ss, sd, o + i * d_in * ds, dd, 1);
    }
  }
}

void fill(const Tensor& dst, double value) {
  char elem[8];
  convert(&value, DType::Float64, elem, dst.dtype(), 1);
  const size_t es = dst.element_size();
  if (dst.is_dense()) {
    char* p = static_cast<char*>(dst.data_ptr());
    const int64_t n = dst.numel();
    // One typed fill per element size (a memcpy call per element took 46 ms for GPT-2's 50,304 x 768 bfloat16).
    auto fill_as = [&](auto v) {
      std::memcpy(&v, elem, sizeof(v));
      std::fill_n(reinterpret_cast<decltype(v)*>(p), n, v);
    };
    switch (es) {
      case 1: return fill_as(uint8_t{});
      case 2: return fill_as(uint16_t{});
      case 4: return fill_as(uint32_t{});
      case 8: return fill_as(uint64_t{});
      default:
        for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * es, elem, es);
        return;
    }
  }
  Tensor one = from_blob(elem, {}, dst.dtype());
  copy(one.expand(dst.shape()), dst);
}

// ---- unary ----

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

// The forms below avoid the cancellation in 1 + erf(x / sqrt 2) and 1 + tanh(u) for x << 0, where the textbook
// forms lose every digit: 1 + erf(-z) = erfc(z) and 1 + tanh(u) = 2 sigmoid(2u).
template <class T>
T gelu(T x) {
  return T(0.5) * x * std::erfc(-x * T(kSqrt1_2));
}

template <class T>
T gelu_tanh(T x) {
  T inner = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
  return x / (T(1) + std::exp(T(-2) * inner));
}

template <class T>
T gelu_tanh_grad(T x) {
  T x2 = x * x;
  T inner = T(kSqrt2OverPi) * (x + T(0.044715) * x2 * x);
  T e = std::exp(T(-2) * inner);
  T s = T(1) / (T(1) + e), one_minus_s = T(1) / (T(1) + T(1) / e);  // sigmoid(2u), sigmoid(-2u); no inf/inf
  T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x2);
  return s + T(2) * x * s * one_minus_s * dinner;
}

// silu(x) = x sigmoid(x); silu'(x) = s (1 + x (1 - s)), PyTorch's formula.
template <class T>
T silu_grad(T x) {
  T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

template <class T>
T gelu_grad(T x) {
  T cdf = T(0.5) * std::erfc(-x * T(kSqrt1_2));
  T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
  return cdf + x * pdf;
}

}  // namespace

void unary(Unary op, const Tensor& src, const Tensor& dst, double p0, double p1) {
  CASTOR_ASSERT(src.dtype() == dst.dtype() && (same_layout(src, dst) || (src.is_contiguous() && dst.is_contiguous() &&
                                                                         src.numel() == dst.numel())),
                "unary on ", src.describe(), " -> ", dst.describe());
  auto run = [&](auto f) { map_float(src, dst, f); };
  switch (op) {
    case Unary::Neg: return run([](auto x) { return -x; });
    case Unary::Exp: return run([](auto x) { return std::exp(x); });
    case Unary::Log: return run([](auto x) { return std::log(x); });
    case Unary::Sqrt: return run([](auto x) { return std::sqrt(x); });
    case Unary::Abs: return run([](auto x) { return std::abs(x); });
    // PyTorch's relu: NaN and -0 pass through. Branch-free, so it vectorises.
    case Unary::Relu: return run([](auto x) { return std::max(x, decltype(x)(0)); });
    case Unary::Sigmoid: return run([](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); });
    case Unary::Tanh: return run([](auto x) { return std::tanh(x); });
    case Unary::Gelu: return run([](auto x) { return gelu(x); });
    case Unary::GeluTanh:
      if (gelu_tanh_fast(src, dst)) return;
      return run([](auto x) { return gelu_tanh(x); });
    case Unary::Silu: return run([](auto x) { return x / (decltype(x)(1) + std::exp(-x)); });
    case Unary::Pow: {
      if (p0 == 2.0) return run([](auto x) { return x * x; });
      return run([p0](auto x) { return std::pow(x, decltype(x)(p0)); });
    }
    case Unary::Clamp:
      return run([p0, p1](auto x) {
        using T = decltype(x);
        return x != x ? x : std::min(std::max(x, T(p0)), T(p1));
      });
    case Unary::AddScalar: return run([p0](auto x) { return x + decltype(x)(p0); });
    case Unary::MulScalar: return run([p0](auto x) { return x * decltype(x)(p0); });
  }
  CASTOR_ASSERT(false, "unknown unary op");
}

// ---- binary ----

void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& dst, double alpha) {
  auto run = [&](auto f) { zip(a, b, dst, f); };
  switch (op) {
    case Binary::Add:
      if (alpha == 1.0) return run([](auto x, auto y) { return x + y; });
      return run([alpha](auto x, auto y) { return x + static_cast<decltype(x)>(alpha) * y; });
    case Binary::Sub:
      if (alpha == 1.0) return run([](auto x, auto y) { return x - y; });
      return run([alpha](auto x, auto y) { return x - static_cast<decltype(x)>(alpha) * y; });
    case Binary::Mul: return run([](auto x, auto y) { return x * y; });
    case Binary::Div: return run([](auto x, auto y) { return x / y; });
    case Binary::Max: return run([](auto x, auto y) { return (x != x || x > y) ? x : y; });
    case Binary::Min: return run([](auto x, auto y) { return (x != x || x < y) ? x : y; });
    case Binary::ReluGrad: return run([](auto g, auto x) { return x > 0 ? g : decltype(g)(0); });
    case Binary::SigmoidGrad: return run([](auto g, auto y) { return g * y * (decltype(y)(1) - y); });
    case Binary::TanhGrad: return run([](auto g, auto y) { return g * (decltype(y)(1) - y * y); });
    case Binary::GeluGrad: return run([](auto g, auto x) { return g * gelu_grad(x); });
    case Binary::GeluTanhGrad:
      if (gelu_tanh_grad_fast(a, b, dst)) return;
      return run([](auto g, auto x) { return g * gelu_tanh_grad(x); });
    // (the derivative in double: s (1 + x (1 - s)) cancels in float32 for x < 0)
    case Binary::SiluGrad:
      return run([](auto g, auto x) { return g * static_cast<decltype(x)>(silu_grad(static_cast<double>(x))); });
  }
  CASTOR_ASSERT(false, "unknown binary op");
}

void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& dst) {
  CASTOR_ASSERT(a.dtype() == dst.dtype() && b.dtype() == dst.dtype() && a.numel() == dst.numel() &&
                    b.numel() == dst.numel() && a.is_contiguous() && b.is_contiguous() && dst.is_contiguous(),
                "swiglu on ", a.describe(), ", ", b.describe(), " -> ", dst.describe());
  if (swiglu_fast(a, b, dst)) return;
  zip(a, b, dst, [](auto x, auto y) { return x / (decltype(x)(1) + std::exp(-x)) * y; });
}

void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& diff_dst, const Tensor& diff_a,
                     const Tensor& diff_b) {
  const DType d = a.dtype();
  const int64_t n = a.numel();
  for (const Tensor* t : {&b, &diff_dst, &diff_a, &diff_b})
    CASTOR_ASSERT(!t->defined() || (t->dtype() == d && t->numel() == n && t->is_contiguous()),
                  "swiglu_backward: ", t->describe(), " with a ", a.describe());
  if (swiglu_grad_fast(a, b, diff_dst, diff_a, diff_b)) return;
  with_compute_type(d, [&](auto tag) {
    using T = decltype(tag);
    parallel_blocks(n, [&](int64_t lo, int64_t hi) {
      T ab[kBlock], bb[kBlock], gb[kBlock], da[kBlock], db[kBlock];
      const T* x = load_block(a, lo, hi, ab);
      const T* y = load_block(b, lo, hi, bb);
      const T* g = load_block(diff_dst, lo, hi, gb);
      for (int64_t i = 0; i < hi - lo; ++i) {
        db[i] = g[i] * (x[i] / (T(1) + std::exp(-x[i])));
        da[i] = g[i] * y[i] * static_cast<T>(silu_grad(static_cast<double>(x[i])));
      }
      const size_t at = lo * dtype_size(d);
      if (diff_a.defined()) convert(da, dtype_of<T>(), static_cast<char*>(diff_a.data_ptr()) + at, d, hi - lo);
      if (diff_b.defined()) convert(db, dtype_of<T>(), static_cast<char*>(diff_b.data_ptr()) + at, d, hi - lo);
    });
  });
}

void compare(Compare op, const Tensor& a, const Tensor& b, const Tensor& dst) {
  auto run = [&](auto f) { zip_to_bool(a, b, dst, f); };
  switch (op) {
    case Compare::Eq: return run([](auto x, auto y) { return x == y; });
    case Compare::Ne: return run([](auto x, auto y) { return x != y; });
    case Compare::Lt: return run([](auto x, auto y) { return x < y; });
    case Compare::Le: return run([](auto x, auto y) { return x <= y; });
    case Compare::Gt: return run([](auto x, auto y) { return x > y; });
    case Compare::Ge: return run([](auto x, auto y) { return x >= y; });
  }
  CASTOR_ASSERT(false, "unknown compare op");
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& dst) {
  const bool* c = cond.data<bool>();
  const size_t es = dst.element_size();
  const char* ap = static_cast<const char*>(a.data_ptr());
  const char* bp = static_cast<const char*>(b.data_ptr());
  char* o = static_cast<char*>(dst.data_ptr());
  const int64_t n = dst.numel();
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * es, (c[i] ? ap : bp) + i * es, es);
}

bool all_finite(const Tensor& src) {
  Tensor t = src.contiguous();
  const int64_t n = t.numel();
  bool ok = true;
  switch (t.dtype()) {
    case DType::Float32: {
      const uint32_t* p = static_cast<const uint32_t*>(t.data_ptr());
      uint32_t bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((p[i] & 0x7f800000u) == 0x7f800000u);
      ok = !bad;
      break;
    }
    case DType::Float16:
    case DType::BFloat16: {
      const uint16_t mask = t.dtype() == DType::Float16 ? 0x7c00 : 0x7f80;
      const uint16_t* p = static_cast<const uint16_t*>(t.data_ptr());
      uint32_t bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((p[i] & mask) == mask);
      ok = !bad;
      break;
    }
    case DType::Float64: {
      const double* p = t.data<double>();
      for (int64_t i = 0; i < n && ok; ++i) ok = std::isfinite(p[i]);
      break;
    }
    default: break;  // integers are always finite
  }
  return ok;
}

}  // namespace castor::kernels
