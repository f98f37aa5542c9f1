// Bulk dtype conversion: F16C/AVX2/AVX-512/AVX512-BF16 kernels picked at run time, and the any-to-any convert().
#include "castor/convert.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "castor/check.h"
#include "core/convert_kernels.h"

namespace castor {
namespace detail {
namespace {

// ---- portable: the scalar conversions of half.h, element by element (also the tails of the SIMD kernels)

void f32_to_f16_portable(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}
void f16_to_f32_portable(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
}
void f32_to_bf16_portable(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(src[i]);
}
void bf16_to_f32_portable(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}
bool portable_supported() { return true; }

// ---- AVX2 + F16C. vcvtps2ph/vcvtph2ps round to nearest even, keep subnormals, ignore MXCSR.DAZ/FTZ for
// half values, and quiet NaNs keeping the top payload bits: exactly the portable results.

constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRoundNearest);
    __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), kRoundNearest);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_set_m128i(b, a));
  }
  f32_to_f16_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
  }
  f16_to_f32_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = f32_to_bf16_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    __m256i b = f32_to_bf16_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit half: [a0-3 b0-3 a4-7 b4-7]; the permute restores element order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  f32_to_bf16_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 8), _mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
  }
  bf16_to_f32_portable(src + i, dst + i, n - i);
}

bool avx2_supported() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return f16c && __builtin_cpu_supports("avx2");
}

// ---- AVX-512F: the same instructions on 16 lanes; bfloat16 by integer rounding.
// (GCC 12 wrongly warns about _mm512_undefined_* inside its own intrinsics: PR105593.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRoundNearest));
  }
  f32_to_f16_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx512f"))) void f16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  f16_to_f32_portable(src + i, dst + i, n - i);
}

// Streaming variants (Stream = true) write with non-temporal stores, which skip reading the destination's cache
// lines first and do not evict what the cache holds: for outputs read again only much later. The elements before
// the first aligned store go through the portable loop; the stores are fenced before returning.
template <class T>
size_t unaligned_head(const T* dst, size_t align, size_t n) {
  const size_t mis = reinterpret_cast<uintptr_t>(dst) % align;
  if (mis == 0) return 0;
  return mis % sizeof(T) != 0 ? n : std::min(n, (align - mis) / sizeof(T));  // (an element never aligns: all)
}

__attribute__((target("avx512f"))) void store_bf16x16(uint16_t* dst, __m256i v, std::false_type) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
}
__attribute__((target("avx512f"))) void store_bf16x16(uint16_t* dst, __m256i v, std::true_type) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), v);
}

template <bool Stream>
__attribute__((target("avx512f"))) void f32_to_bf16_avx512_impl(const float* src, uint16_t* dst, size_t n) {
  size_t i = Stream ? unaligned_head(dst, 32, n) : 0;
  f32_to_bf16_portable(src, dst, i);
  for (; i + 16 <= n; i += 16)
    store_bf16x16(dst + i, f32_to_bf16_lanes_avx512(_mm512_loadu_si512(src + i)), std::bool_constant<Stream>());
  f32_to_bf16_portable(src + i, dst + i, n - i);
  if (Stream) _mm_sfence();
}
void f32_to_bf16_avx512(const float* src, uint16_t* dst, size_t n) { f32_to_bf16_avx512_impl<false>(src, dst, n); }
void f32_to_bf16_avx512_stream(const float* src, uint16_t* dst, size_t n) {
  f32_to_bf16_avx512_impl<true>(src, dst, n);
}

template <bool Stream>
__attribute__((target("avx512f"))) void bf16_to_f32_avx512_impl(const uint16_t* src, float* dst, size_t n) {
  size_t i = Stream ? unaligned_head(dst, 64, n) : 0;
  bf16_to_f32_portable(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))), 16);
    if (Stream)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), w);
    else
      _mm512_storeu_si512(dst + i, w);
  }
  bf16_to_f32_portable(src + i, dst + i, n - i);
  if (Stream) _mm_sfence();
}
void bf16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) { bf16_to_f32_avx512_impl<false>(src, dst, n); }
void bf16_to_f32_avx512_stream(const uint16_t* src, float* dst, size_t n) {
  bf16_to_f32_avx512_impl<true>(src, dst, n);
}

// The cap oneDNN reads from ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA): "AVX2", "AVX512_CORE", "AVX512_CORE_BF16",
// "ALL", ... Castor's own kernels honour it too, so that one variable makes a CPU with AVX-512 run end to end as an
// AVX2-only (or AVX-512 without BF16) one: the benchmarks' and tests' way to reach the other dispatch paths.
std::string isa_cap() {
  const char* v = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!v) v = std::getenv("DNNL_MAX_CPU_ISA");
  std::string cap = v ? v : "";
  for (char& ch : cap) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return cap;
}
bool cap_allows_avx512() {
  const std::string cap = isa_cap();
  return cap.empty() || cap == "ALL" || cap.rfind("AVX512", 0) == 0;
}
bool cap_allows_avx512bf16() {
  const std::string cap = isa_cap();
  return cap.empty() || cap == "ALL" || cap.find("BF16") != std::string::npos || cap.find("AMX") != std::string::npos;
}

bool avx512_supported() { return __builtin_cpu_supports("avx512f") && avx2_supported() && cap_allows_avx512(); }

// ---- AVX512-BF16: vcvtneps2bf16 rounds to nearest even but treats subnormal inputs as zero and may not
// keep NaN payloads, so any block holding a subnormal or NaN lane is redone by integer rounding.

template <bool Stream>
__attribute__((target("avx512f,avx512bf16"))) void f32_to_bf16_avx512bf16_impl(const float* src, uint16_t* dst,
                                                                               size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  size_t i = Stream ? unaligned_head(dst, 32, n) : 0;
  f32_to_bf16_portable(src, dst, i);
  for (; i + 16 <= n; i += 16) {
    __m512i u = _mm512_loadu_si512(src + i);
    __m512i abs = _mm512_and_si512(u, abs_mask);
    // subnormal: 1 <= abs <= 0x7fffff, i.e. abs - 1 < 0x7fffff unsigned; NaN: abs > 0x7f800000.
    __mmask16 special = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                                _mm512_set1_epi32(0x7fffff)) |
                        _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m256i r = special ? f32_to_bf16_lanes_avx512(u) : (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
    store_bf16x16(dst + i, r, std::bool_constant<Stream>());
  }
  f32_to_bf16_portable(src + i, dst + i, n - i);
  if (Stream) _mm_sfence();
}
void f32_to_bf16_avx512bf16(const float* src, uint16_t* dst, size_t n) {
  f32_to_bf16_avx512bf16_impl<false>(src, dst, n);
}
void f32_to_bf16_avx512bf16_stream(const float* src, uint16_t* dst, size_t n) {
  f32_to_bf16_avx512bf16_impl<true>(src, dst, n);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool avx512bf16_supported() {
  return __builtin_cpu_supports("avx512bf16") && avx512_supported() && cap_allows_avx512bf16();
}

}  // namespace

const ConvertKernels kConvertKernels[] = {
    {"avx512bf16", avx512bf16_supported, f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512bf16,
     bf16_to_f32_avx512, f32_to_bf16_avx512bf16_stream, bf16_to_f32_avx512_stream},
    {"avx512f", avx512_supported, f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512, bf16_to_f32_avx512,
     f32_to_bf16_avx512_stream, bf16_to_f32_avx512_stream},
    {"avx2+f16c", avx2_supported, f32_to_f16_avx2, f16_to_f32_avx2, f32_to_bf16_avx2, bf16_to_f32_avx2,
     f32_to_bf16_avx2, bf16_to_f32_avx2},
    {"portable", portable_supported, f32_to_f16_portable, f16_to_f32_portable, f32_to_bf16_portable,
     bf16_to_f32_portable, f32_to_bf16_portable, bf16_to_f32_portable},
};
const size_t kNumConvertKernels = sizeof(kConvertKernels) / sizeof(kConvertKernels[0]);

}  // namespace detail

namespace {

const detail::ConvertKernels& active_kernels() {
  static const detail::ConvertKernels& k = *std::find_if(detail::kConvertKernels,
                                                         detail::kConvertKernels + detail::kNumConvertKernels,
                                                         [](const detail::ConvertKernels& c) { return c.supported(); });
  return k;
}

// Calls f(begin, end) over [0, n): inline when small, else in 16K-element chunks spread over OpenMP threads.
template <class F>
void parallel_chunks(size_t n, const F& f) {
  constexpr size_t kParallelMin = size_t{1} << 16;
  constexpr size_t kChunk = size_t{1} << 14;
  if (n <= kParallelMin) {
    f(0, n);
    return;
  }
  const auto chunks = static_cast<ptrdiff_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (ptrdiff_t c = 0; c < chunks; ++c) {
    size_t begin = static_cast<size_t>(c) * kChunk;
    f(begin, std::min(n, begin + kChunk));
  }
}

template <class S, class D>
void run_bulk(void (*kernel)(const S*, D*, size_t), const S* src, D* dst, size_t n) {
  parallel_chunks(n, [&](size_t b, size_t e) { kernel(src + b, dst + b, e - b); });
}

// Floating -> integer as x86 PyTorch does it: truncate; NaN or out of range gives the minimum of the
// conversion's integer type (int32 for Int32, else int64); UInt8 keeps the low bits of the int64.
template <class D, class S>
D float_to_int(S v) {
  using I = std::conditional_t<std::is_same_v<D, int32_t>, int32_t, int64_t>;
  constexpr double limit = -static_cast<double>(std::numeric_limits<I>::min());  // 2^31 or 2^63, exact
  if (!(v >= -limit && v < limit)) return static_cast<D>(std::numeric_limits<I>::min());
  return static_cast<D>(static_cast<I>(v));
}

template <class D, class S>
D cast_value(S v) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return cast_value<D>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != 0;
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    return float_to_int<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

template <class S, class D>
void cast_loop(const void* src, void* dst, size_t n) {
  auto* out = static_cast<D*>(dst);
  if constexpr (std::is_same_v<S, bool>) {  // read bytes: a bool buffer may hold values other than 0 and 1
    const auto* in = static_cast<const uint8_t*>(src);
    for (size_t i = 0; i < n; ++i) out[i] = cast_value<D>(in[i] != 0);
  } else {
    const auto* in = static_cast<const S*>(src);
    for (size_t i = 0; i < n; ++i) out[i] = cast_value<D>(in[i]);
  }
}

template <class S>
void cast_from(const void* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
#define CASTOR_CAST_TO(E, T, N, SN, C) \
  case DType::E: return cast_loop<S, T>(src, dst, n);
    CASTOR_FORALL_DTYPES(CASTOR_CAST_TO)
#undef CASTOR_CAST_TO
  }
}

void cast_any(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  switch (src_dtype) {
#define CASTOR_CAST_FROM(E, T, N, SN, C) \
  case DType::E: return cast_from<T>(src, dst, dst_dtype, n);
    CASTOR_FORALL_DTYPES(CASTOR_CAST_FROM)
#undef CASTOR_CAST_FROM
  }
}

// One chunk of convert(), on the calling thread.
void convert_chunk(const char* src, DType sd, char* dst, DType dd, size_t n) {
  const auto& k = active_kernels();
  auto* s16 = reinterpret_cast<const uint16_t*>(src);
  auto* d16 = reinterpret_cast<uint16_t*>(dst);
  auto* sf = reinterpret_cast<const float*>(src);
  auto* df = reinterpret_cast<float*>(dst);
  if (sd == DType::Float32 && dd == DType::Float16) return k.f32_to_f16(sf, d16, n);
  if (sd == DType::Float16 && dd == DType::Float32) return k.f16_to_f32(s16, df, n);
  if (sd == DType::Float32 && dd == DType::BFloat16) return k.f32_to_bf16(sf, d16, n);
  if (sd == DType::BFloat16 && dd == DType::Float32) return k.bf16_to_f32(s16, df, n);
  if (is_16bit_float(sd) || is_16bit_float(dd)) {  // through a float32 buffer, with the fast kernels
    constexpr size_t kBlock = 1024;
    float buf[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      size_t m = std::min(kBlock, n - i);
      convert_chunk(src + i * dtype_size(sd), sd, reinterpret_cast<char*>(buf), DType::Float32, m);
      convert_chunk(reinterpret_cast<const char*>(buf), DType::Float32, dst + i * dtype_size(dd), dd, m);
    }
    return;
  }
  cast_any(src, sd, dst, dd, n);
}

}  // namespace

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  run_bulk(active_kernels().f32_to_f16, src, dst, n);
}
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  run_bulk(active_kernels().f16_to_f32, src, dst, n);
}
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  run_bulk(active_kernels().f32_to_bf16, src, dst, n);
}
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  run_bulk(active_kernels().bf16_to_f32, src, dst, n);
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  CASTOR_CHECK(static_cast<int>(src_dtype) < kNumDTypes && static_cast<int>(dst_dtype) < kNumDTypes,
               "convert: unknown dtype ", static_cast<int>(src_dtype), " -> ", static_cast<int>(dst_dtype));
  if (src_dtype == dst_dtype) return convert_serial(src, src_dtype, dst, dst_dtype, n);
  const size_t ss = dtype_size(src_dtype), ds = dtype_size(dst_dtype);
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  parallel_chunks(n, [&](size_t b, size_t e) { convert_chunk(s + b * ss, src_dtype, d + b * ds, dst_dtype, e - b); });
}

void convert_serial(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src_dtype == dst_dtype) {
    if (n != 0 && src != dst) std::memmove(dst, src, n * dtype_size(src_dtype));
    return;
  }
  convert_chunk(static_cast<const char*>(src), src_dtype, static_cast<char*>(dst), dst_dtype, n);
}

void convert_streaming(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  const auto& k = active_kernels();
  if (src_dtype == DType::Float32 && dst_dtype == DType::BFloat16)
    return run_bulk(k.f32_to_bf16_stream, static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  if (src_dtype == DType::BFloat16 && dst_dtype == DType::Float32)
    return run_bulk(k.bf16_to_f32_stream, static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  convert(src, src_dtype, dst, dst_dtype, n);
}

const char* conversion_isa() { return active_kernels().isa; }

bool detail::isa_enabled(const char* isa) {
  const auto* end = detail::kConvertKernels + detail::kNumConvertKernels;
  const auto* row = std::find_if(detail::kConvertKernels, end,
                                 [&](const detail::ConvertKernels& c) { return std::string(c.isa) == isa; });
  CASTOR_ASSERT(row != end, "isa_enabled: no kernel set ", isa);
  return row >= &active_kernels();
}

bool avx512_kernels() {
  static const bool on = std::string(conversion_isa()).rfind("avx512", 0) == 0;
  return on;
}

bool avx512_vbmi_kernels() {
  static const bool on = avx512_kernels() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
  return on;
}

}  // namespace castor
