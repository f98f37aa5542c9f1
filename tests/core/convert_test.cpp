// Tests for the float16/bfloat16 conversions: scalar vs independent oracles, every bulk kernel, PyTorch, convert().
#include "castor/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "castor/check.h"
#include "core/convert_kernels.h"

namespace castor {
namespace {

using detail::ConvertKernels;

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<const ConvertKernels*> runnable_kernels() {
  std::vector<const ConvertKernels*> out;
  for (size_t i = 0; i < detail::kNumConvertKernels; ++i) {
    if (detail::kConvertKernels[i].supported()) out.push_back(&detail::kConvertKernels[i]);
  }
  return out;
}

// A 16-bit float format: 1 sign bit, exp_bits exponent bits, man_bits mantissa bits.
struct Format {
  int exp_bits;
  int man_bits;
  uint16_t inf_bits() const { return static_cast<uint16_t>(((1u << exp_bits) - 1) << man_bits); }
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
};
constexpr Format kHalf{5, 10};
constexpr Format kBf16{8, 7};

// Independent decoding: the value of a 16-bit pattern from its fields, via ldexp.
double ldexp_value(uint16_t bits, Format f) {
  int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  int m = bits & ((1 << f.man_bits) - 1);
  double mag;
  if (e == (1 << f.exp_bits) - 1) {
    mag = m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(m, 1 - f.bias() - f.man_bits);
  } else {
    mag = std::ldexp(m + (1 << f.man_bits), e - f.bias() - f.man_bits);
  }
  return (bits & 0x8000) ? -mag : mag;
}

bool is_nan16(uint16_t b, Format f) { return (b & f.inf_bits()) == f.inf_bits() && (b & ((1u << f.man_bits) - 1)); }

// Independent rounding oracle, by search instead of bit manipulation: a sorted table of every finite
// non-negative value, ending with 2^(emax+1) in the slot of the infinity pattern (it has an even mantissa, so
// ties at the top round to it). A value rounds to its nearer neighbour, ties to the even pattern; the midpoint
// of two neighbours is exact in double.
class RoundingOracle {
 public:
  explicit RoundingOracle(Format f) : format_(f) {
    for (uint32_t b = 0; b < f.inf_bits(); ++b) values_.push_back(ldexp_value(static_cast<uint16_t>(b), f));
    values_.push_back(std::ldexp(1.0, (1 << f.exp_bits) - 1 - f.bias()));
  }
  uint16_t round(float x) const {  // x must not be NaN
    auto sign = static_cast<uint16_t>(std::signbit(x) ? 0x8000 : 0);
    double a = std::fabs(static_cast<double>(x));
    if (a >= values_.back()) return sign | format_.inf_bits();
    size_t hi = std::lower_bound(values_.begin(), values_.end(), a) - values_.begin();
    if (values_[hi] == a) return static_cast<uint16_t>(sign | hi);
    size_t lo = hi - 1;
    double mid = (values_[lo] + values_[hi]) / 2;
    size_t pick = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    return static_cast<uint16_t>(sign | pick);
  }

 private:
  Format format_;
  std::vector<double> values_;
};

// Float32 patterns for rounding tests: for every sign and exponent (inf/NaN included), mantissas whose low p bits
// (p = 1..23, every possible rounding position) sit at 0, 1, just below/at/above the midpoint and all ones, with
// the kept lowest bit both even and odd; then random patterns and named boundaries.
std::vector<float> float_sweep() {
  std::mt19937 rng(20240607);
  std::vector<uint32_t> highs = {0, 0x7fffff, 0x2aaaaa, 0x555555};
  for (int i = 0; i < 4; ++i) highs.push_back(rng() & 0x7fffffu);
  std::vector<uint32_t> mans;
  for (int p = 1; p <= 23; ++p) {
    uint32_t low_mask = (1u << p) - 1, half = 1u << (p - 1);
    for (uint32_t h : highs) {
      for (uint32_t odd : {0u, 1u}) {
        uint32_t base = h & ~low_mask & 0x7fffffu;
        if (p < 23) base = odd ? (base | (1u << p)) : (base & ~(1u << p));
        for (uint32_t low : {0u, 1u, half - 1, half, half + 1, low_mask}) mans.push_back(base | low);
      }
    }
  }
  std::sort(mans.begin(), mans.end());
  mans.erase(std::unique(mans.begin(), mans.end()), mans.end());
  std::vector<float> out;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m : mans) out.push_back(float_of(sign | (e << 23) | m));
    }
  }
  for (int i = 0; i < (1 << 20); ++i) out.push_back(float_of(static_cast<uint32_t>(rng())));
  for (float v : {65504.0f, 65520.0f, 65536.0f, 2.0f * 65504.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1p-126f,
                  0x1p-149f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(), 0.0f}) {
    for (float s : {v, -v, std::nextafter(v, 0.0f), std::nextafter(v, INFINITY), -std::nextafter(v, INFINITY)}) {
      out.push_back(s);
    }
  }
  return out;
}

// Counts positions where two bit arrays differ and reports the first few.
template <class T>
size_t count_mismatches(const std::vector<T>& got, const std::vector<T>& want, const std::vector<float>& input,
                        const char* what) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << what << ": input 0x" << std::hex << bits_of(input[i]) << " (" << input[i] << ") gave 0x"
                    << +got[i] << ", want 0x" << +want[i];
    }
  }
  return bad;
}

std::vector<uint16_t> all_16bit_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

TEST(HalfScalar, EveryPatternMatchesLdexpAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto b = static_cast<uint16_t>(h);
    float f = half_bits_to_float(b);
    double want = ldexp_value(b, kHalf);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(bits_of(f), ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13)) << std::hex << h;
      ASSERT_EQ(float_to_half_bits(f), h | 0x200u) << std::hex << h;  // quieted, sign and payload kept
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
      ASSERT_EQ(float_to_half_bits(f), h) << std::hex << h;
    }
  }
}

TEST(BFloat16Scalar, EveryPatternMatchesLdexpAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto b = static_cast<uint16_t>(h);
    float f = bf16_bits_to_float(b);
    double want = ldexp_value(b, kBf16);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(float_to_bf16_bits(f), h | 0x40u) << std::hex << h;  // quieted, sign and payload kept
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
      ASSERT_EQ(float_to_bf16_bits(f), h) << std::hex << h;
    }
  }
}

TEST(BulkKernels, EverySixteenBitPatternMatchesScalar) {
  auto patterns = all_16bit_patterns();
  std::vector<float> want_h(65536), want_b(65536), got(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    want_h[i] = half_bits_to_float(patterns[i]);
    want_b[i] = bf16_bits_to_float(patterns[i]);
  }
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  for (const ConvertKernels* k : runnable_kernels()) {
    SCOPED_TRACE(k->isa);
    k->f16_to_f32(patterns.data(), got.data(), got.size());
    EXPECT_TRUE(same_bits(got, want_h));
    k->bf16_to_f32(patterns.data(), got.data(), got.size());
    EXPECT_TRUE(same_bits(got, want_b));
    k->bf16_to_f32_stream(patterns.data(), got.data(), got.size());
    EXPECT_TRUE(same_bits(got, want_b));
  }
  convert_f16_to_f32(patterns.data(), got.data(), got.size());
  EXPECT_TRUE(same_bits(got, want_h));
  convert_bf16_to_f32(patterns.data(), got.data(), got.size());
  EXPECT_TRUE(same_bits(got, want_b));
}

// Rounds the sweep with the oracle (scalar and every kernel must agree with it) for a format.
void check_sweep_against_oracle(Format f, uint16_t (*scalar)(float),
                                void (*public_bulk)(const float*, uint16_t*, size_t),
                                void (*ConvertKernels::*kernel)(const float*, uint16_t*, size_t), const char* name) {
  RoundingOracle oracle(f);
  std::vector<float> in = float_sweep();
  std::vector<uint16_t> want(in.size()), scalar_out(in.size()), got(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t u = bits_of(in[i]);
    if (std::isnan(in[i])) {  // quiet NaN, sign kept, top payload bits kept
      want[i] = static_cast<uint16_t>(((u >> 16) & 0x8000u) | f.inf_bits() | (1u << (f.man_bits - 1)) |
                                      ((u & 0x7fffffu) >> (23 - f.man_bits)));
    } else {
      want[i] = oracle.round(in[i]);
    }
    scalar_out[i] = scalar(in[i]);
  }
  EXPECT_EQ(count_mismatches(scalar_out, want, in, name), 0u) << "scalar vs oracle, " << in.size() << " inputs";
  for (const ConvertKernels* k : runnable_kernels()) {
    (k->*kernel)(in.data(), got.data(), in.size());
    EXPECT_EQ(count_mismatches(got, want, in, k->isa), 0u) << name << " kernel " << k->isa;
  }
  public_bulk(in.data(), got.data(), in.size());
  EXPECT_EQ(count_mismatches(got, want, in, "public bulk"), 0u) << name;
}

TEST(FloatToHalf, SweepMatchesOracle) {
  check_sweep_against_oracle(kHalf, float_to_half_bits, convert_f32_to_f16, &ConvertKernels::f32_to_f16, "f32->f16");
}

TEST(FloatToBFloat16, SweepMatchesOracle) {
  check_sweep_against_oracle(kBf16, float_to_bf16_bits, convert_f32_to_bf16, &ConvertKernels::f32_to_bf16, "f32->bf16");
  auto streaming = [](const float* src, uint16_t* dst, size_t n) {
    convert_streaming(src, DType::Float32, dst, DType::BFloat16, n);
  };
  check_sweep_against_oracle(kBf16, float_to_bf16_bits, streaming, &ConvertKernels::f32_to_bf16_stream,
                             "f32->bf16 streaming");
}

TEST(FloatToHalf, NamedBoundaries) {
  struct Case {
    float in;
    uint16_t half, bf16;
  };
  const Case cases[] = {
      {65504.0f, 0x7bff, 0x4780},                        // largest half; bf16 rounds up to 65536
      {std::nextafter(65520.0f, 0.0f), 0x7bff, 0x4780},  // just below the overflow midpoint
      {65520.0f, 0x7c00, 0x4780},                        // the midpoint: ties to even = 2^16 = overflow
      {-65520.0f, 0xfc00, 0xc780},
      {0x1p-24f, 0x0001, 0x3380},  // smallest subnormal half
      {0x1p-25f, 0x0000, 0x3300},  // tie between 0 and 2^-24: even is 0
      {std::nextafter(0x1p-25f, 1.0f), 0x0001, 0x3300},
      {0x1.8p-24f, 0x0002, 0x33c0},       // 1.5 units: tie, rounds to even 2
      {0x1.4p-23f, 0x0002, 0x3420},       // 2.5 units: tie, rounds to even 2
      {0x1.ffcp-15f, 0x0400, 0x3880},     // largest subnormal + half a unit: ties to the smallest normal
      {1.0f + 0x1p-11f, 0x3c00, 0x3f80},  // tie, even is 1.0
      {1.0f + 0x3p-11f, 0x3c02, 0x3f80},  // tie, even is up
      {-0.0f, 0x8000, 0x8000},
      {std::numeric_limits<float>::max(), 0x7c00, 0x7f80},
      {-std::numeric_limits<float>::infinity(), 0xfc00, 0xff80},
      {0x1p-149f, 0x0000, 0x0000},
      {-0x1.fffffcp-127f, 0x8000, 0x8080},      // largest subnormal float rounds up to the smallest normal bf16
      {float_of(0xffc00001u), 0xfe00, 0xffc0},  // -NaN keeps its sign
      {float_of(0x7f802000u), 0x7e01, 0x7fc0},  // signalling NaN is quieted, payload top bits kept
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_half_bits(c.in), c.half) << std::hexfloat << c.in;
    EXPECT_EQ(float_to_bf16_bits(c.in), c.bf16) << std::hexfloat << c.in;
  }
}

// Inputs for the length tests: random values of every class.
std::vector<float> mixed_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (rng() % 4) {
      case 0: x = std::ldexp(static_cast<float>(rng() % 100000) / 1000.0f, static_cast<int>(rng() % 60) - 40); break;
      case 1: x = float_of(static_cast<uint32_t>(rng())); break;                 // any pattern: NaNs, subnormals, huge
      case 2: x = float_of((rng() & 0x807fffffu) | ((rng() % 3) << 23)); break;  // near and below the subnormals
      default: x = float_of(static_cast<uint32_t>(rng()) | 0x7f800000u); break;  // NaN or inf
    }
  }
  return v;
}

std::vector<uint16_t> random_16bit(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = static_cast<uint16_t>(rng());
  return v;
}

// Runs a 32->16 or 16->32 conversion at an offset into larger buffers and checks against the scalar result and
// that nothing outside [offset, offset + n) was written.
template <class S, class D, class Run, class Scalar>
void check_lengths(const char* what, Run run, Scalar scalar, const std::vector<S>& pool) {
  constexpr size_t kGuard = 24;
  for (size_t n = 0; n <= 70; ++n) {
    for (size_t offset : {0, 1, 3}) {
      std::vector<D> dst(n + offset + kGuard, D{});
      std::fill(dst.begin(), dst.end(), static_cast<D>(0x5a5a));
      std::vector<D> want = dst;
      for (size_t i = 0; i < n; ++i) want[offset + i] = scalar(pool[offset + i]);
      run(pool.data() + offset, dst.data() + offset, n);
      ASSERT_EQ(std::memcmp(dst.data(), want.data(), dst.size() * sizeof(D)), 0)
          << what << " n=" << n << " offset=" << offset;
    }
  }
}

TEST(BulkKernels, AllLengthsAndOffsetsMatchScalar) {
  std::vector<float> floats = mixed_floats(128, 7);
  std::vector<uint16_t> halves = random_16bit(128, 8);
  auto f2h = [](float x) { return float_to_half_bits(x); };
  auto f2b = [](float x) { return float_to_bf16_bits(x); };
  auto h2f = [](uint16_t x) { return half_bits_to_float(x); };
  auto b2f = [](uint16_t x) { return bf16_bits_to_float(x); };
  for (const ConvertKernels* k : runnable_kernels()) {
    SCOPED_TRACE(k->isa);
    check_lengths<float, uint16_t>("f32->f16", k->f32_to_f16, f2h, floats);
    check_lengths<float, uint16_t>("f32->bf16", k->f32_to_bf16, f2b, floats);
    check_lengths<uint16_t, float>("f16->f32", k->f16_to_f32, h2f, halves);
    check_lengths<uint16_t, float>("bf16->f32", k->bf16_to_f32, b2f, halves);
    check_lengths<float, uint16_t>("f32->bf16 streaming", k->f32_to_bf16_stream, f2b, floats);
    check_lengths<uint16_t, float>("bf16->f32 streaming", k->bf16_to_f32_stream, b2f, halves);
  }
  check_lengths<float, uint16_t>("convert_f32_to_f16", convert_f32_to_f16, f2h, floats);
  check_lengths<float, uint16_t>("convert_f32_to_bf16", convert_f32_to_bf16, f2b, floats);
  check_lengths<uint16_t, float>("convert_f16_to_f32", convert_f16_to_f32, h2f, halves);
  check_lengths<uint16_t, float>("convert_bf16_to_f32", convert_bf16_to_f32, b2f, halves);
  auto generic = [](DType s, DType d) {
    return [s, d](const void* src, void* dst, size_t n) { convert(src, s, dst, d, n); };
  };
  check_lengths<float, uint16_t>("convert F32->F16", generic(DType::Float32, DType::Float16), f2h, floats);
  check_lengths<uint16_t, float>("convert BF16->F32", generic(DType::BFloat16, DType::Float32), b2f, halves);
  auto streaming = [](DType s, DType d) {
    return [s, d](const void* src, void* dst, size_t n) { convert_streaming(src, s, dst, d, n); };
  };
  check_lengths<float, uint16_t>("convert_streaming F32->BF16", streaming(DType::Float32, DType::BFloat16), f2b,
                                 floats);
  check_lengths<uint16_t, float>("convert_streaming BF16->F32", streaming(DType::BFloat16, DType::Float32), b2f,
                                 halves);
  check_lengths<float, uint16_t>("convert_streaming F32->F16", streaming(DType::Float32, DType::Float16), f2h, floats);
}

TEST(BulkKernels, LargeArraysMatchScalar) {
  const size_t n = (size_t{1} << 21) + 37;  // above the OpenMP threshold, ragged end
  std::vector<float> in = mixed_floats(n, 11);
  std::vector<uint16_t> h(n), b(n), want_h(n), want_b(n);
  std::vector<float> back(n), want_back(n);
  for (size_t i = 0; i < n; ++i) {
    want_h[i] = float_to_half_bits(in[i]);
    want_b[i] = float_to_bf16_bits(in[i]);
  }
  convert_f32_to_f16(in.data(), h.data(), n);
  convert_f32_to_bf16(in.data(), b.data(), n);
  EXPECT_EQ(count_mismatches(h, want_h, in, "f32->f16 large"), 0u);
  EXPECT_EQ(count_mismatches(b, want_b, in, "f32->bf16 large"), 0u);
  convert(in.data(), DType::Float32, h.data(), DType::Float16, n);
  EXPECT_EQ(count_mismatches(h, want_h, in, "convert F32->F16 large"), 0u);
  std::fill(b.begin(), b.end(), uint16_t{0});
  convert_streaming(in.data() + 1, DType::Float32, b.data() + 1, DType::BFloat16, n - 1);  // (unaligned)
  b[0] = want_b[0];
  EXPECT_EQ(count_mismatches(b, want_b, in, "convert_streaming F32->BF16 large"), 0u);

  for (size_t i = 0; i < n; ++i) want_back[i] = half_bits_to_float(want_h[i]);
  convert_f16_to_f32(want_h.data(), back.data(), n);
  EXPECT_EQ(std::memcmp(back.data(), want_back.data(), n * 4), 0);
  for (size_t i = 0; i < n; ++i) want_back[i] = bf16_bits_to_float(want_b[i]);
  convert_bf16_to_f32(want_b.data(), back.data(), n);
  EXPECT_EQ(std::memcmp(back.data(), want_back.data(), n * 4), 0);
  std::fill(back.begin(), back.end(), 0.0f);
  convert_streaming(want_b.data(), DType::BFloat16, back.data(), DType::Float32, n);
  EXPECT_EQ(std::memcmp(back.data(), want_back.data(), n * 4), 0);
}

// Every one of the 2^32 float32 patterns through each SIMD kernel vs the scalar conversion.
TEST(BulkKernels, AllFloat32PatternsMatchScalar) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  for (const ConvertKernels* k : runnable_kernels()) {
    if (std::string(k->isa) == "portable") continue;
    int64_t bad_h = 0, bad_b = 0;
#pragma omp parallel reduction(+ : bad_h, bad_b)
    {
      std::vector<float> in(kBlock);
      std::vector<uint16_t> h(kBlock), b(kBlock);
#pragma omp for schedule(dynamic, 16)
      for (int64_t blk = 0; blk < (int64_t{1} << 32) / kBlock; ++blk) {
        for (int64_t i = 0; i < kBlock; ++i) in[i] = float_of(static_cast<uint32_t>(blk * kBlock + i));
        k->f32_to_f16(in.data(), h.data(), kBlock);
        k->f32_to_bf16(in.data(), b.data(), kBlock);
        for (int64_t i = 0; i < kBlock; ++i) {
          bad_h += h[i] != float_to_half_bits(in[i]);
          bad_b += b[i] != float_to_bf16_bits(in[i]);
        }
      }
    }
    EXPECT_EQ(bad_h, 0) << k->isa << " f32->f16";
    EXPECT_EQ(bad_b, 0) << k->isa << " f32->bf16";
  }
}

TEST(ConversionIsa, NamesTheBestSupportedKernels) {
  // ONEDNN_MAX_CPU_ISA caps Castor's kernels as it caps oneDNN's: the IsaCap.* ctest entries run this suite under
  // "AVX2" and "AVX512_CORE" (a no-op cap on CPUs that lack the instructions anyway).
  const char* cap_env = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string cap = cap_env ? cap_env : "";
  const bool avx512 = __builtin_cpu_supports("avx512f") && cap != "AVX2";
  const bool avx512bf16 = __builtin_cpu_supports("avx512bf16") && avx512 && cap != "AVX512_CORE";
  const char* want = avx512bf16                       ? "avx512bf16"
                     : avx512                         ? "avx512f"
                     : __builtin_cpu_supports("avx2") ? "avx2+f16c"
                                                      : "portable";
  EXPECT_STREQ(conversion_isa(), want);
}

template <class T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

std::vector<uint16_t> read_u16_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<uint16_t> v(f ? static_cast<size_t>(f.tellg()) / 2 : 0);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 2));
  return v;
}

// PyTorch's .to(torch.float16) / .to(torch.bfloat16) on the sweep, bit for bit (any NaN for a NaN).
TEST(ConvertTorchParity, SweepMatchesTorchBitForBit) {
  const std::string python = "/usr/bin/python3";
  ASSERT_EQ(std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()), 0)
      << python << " cannot import torch: this test needs PyTorch as its oracle (install torch for " << python << ")";
  const std::string dir = CASTOR_BINARY_DIR;
  const std::string in_path = dir + "/convert_test_in.f32", h_path = dir + "/convert_test_torch.f16",
                    b_path = dir + "/convert_test_torch.bf16";
  std::vector<float> in = float_sweep();
  write_file(in_path, in);
  std::string cmd = python + " " + CASTOR_SOURCE_DIR + "/tests/oracle/torch_convert.py " + in_path + " " + h_path +
                    " " + b_path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "failed: " << cmd;
  std::vector<uint16_t> torch_h = read_u16_file(h_path), torch_b = read_u16_file(b_path);
  ASSERT_EQ(torch_h.size(), in.size());
  ASSERT_EQ(torch_b.size(), in.size());
  std::vector<uint16_t> ours_h(in.size()), ours_b(in.size());
  convert_f32_to_f16(in.data(), ours_h.data(), in.size());
  convert_f32_to_bf16(in.data(), ours_b.data(), in.size());
  size_t nans = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {  // NaN payloads differ (torch canonicalises): only NaN-ness must match
      ++nans;
      ASSERT_TRUE(is_nan16(torch_h[i], kHalf) && is_nan16(ours_h[i], kHalf)) << i;
      ASSERT_TRUE(is_nan16(torch_b[i], kBf16) && is_nan16(ours_b[i], kBf16)) << i;
      torch_h[i] = ours_h[i];
      torch_b[i] = ours_b[i];
    }
  }
  EXPECT_EQ(count_mismatches(ours_h, torch_h, in, "f32->f16 vs torch"), 0u);
  EXPECT_EQ(count_mismatches(ours_b, torch_b, in, "f32->bf16 vs torch"), 0u);
  EXPECT_GT(nans, 0u);
  std::remove(in_path.c_str());
  std::remove(h_path.c_str());
  std::remove(b_path.c_str());
}

// ---- convert() between any two dtypes

// Builds an array of dtype d holding the given values (small integers, exact in every dtype).
std::vector<unsigned char> make_array(DType d, const std::vector<double>& v) {
  std::vector<unsigned char> out(v.size() * dtype_size(d));
  for (size_t i = 0; i < v.size(); ++i) {
    void* p = out.data() + i * dtype_size(d);
    switch (d) {
#define CASTOR_MAKE(E, T, N, S, C)                  \
  case DType::E: {                                  \
    T x = static_cast<T>(static_cast<float>(v[i])); \
    std::memcpy(p, &x, sizeof(T));                  \
    break;                                          \
  }
      CASTOR_FORALL_DTYPES(CASTOR_MAKE)
#undef CASTOR_MAKE
    }
  }
  return out;
}

double read_value(DType d, const std::vector<unsigned char>& a, size_t i) {
  const void* p = a.data() + i * dtype_size(d);
  switch (d) {
#define CASTOR_READ(E, T, N, S, C) \
  case DType::E: {                 \
    T x;                           \
    std::memcpy(&x, p, sizeof(T)); \
    return static_cast<double>(x); \
  }
    CASTOR_FORALL_DTYPES(CASTOR_READ)
#undef CASTOR_READ
  }
  return std::nan("");
}

const DType kAllDTypes[] = {
#define CASTOR_LIST(E, T, N, S, C) DType::E,
    CASTOR_FORALL_DTYPES(CASTOR_LIST)
#undef CASTOR_LIST
};

TEST(Convert, ExactValuesSurviveEveryPair) {
  const std::vector<double> values = {0, 1, 0, 1, 2, 3, 100, 127, 255};
  for (DType s : kAllDTypes) {
    for (DType d : kAllDTypes) {
      std::vector<double> in = values;
      if (s == DType::Bool) {
        for (double& x : in) x = x != 0;
      }
      std::vector<unsigned char> src = make_array(s, in), dst(in.size() * dtype_size(d), 0xee);
      convert(src.data(), s, dst.data(), d, in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        double want = d == DType::Bool ? (in[i] != 0) : in[i];
        EXPECT_EQ(read_value(d, dst, i), want) << dtype_name(s) << " -> " << dtype_name(d) << " value " << in[i];
      }
    }
  }
}

template <class D, class S>
std::vector<D> conv(const std::vector<S>& in, DType s, DType d) {
  EXPECT_EQ(sizeof(S), dtype_size(s));
  EXPECT_EQ(sizeof(D), dtype_size(d));
  std::vector<D> out(in.size());
  convert(in.data(), s, out.data(), d, in.size());
  return out;
}

using I64 = std::vector<int64_t>;
using I32 = std::vector<int32_t>;
using U8 = std::vector<uint8_t>;
using U16 = std::vector<uint16_t>;
using F32 = std::vector<float>;
using F64 = std::vector<double>;

// Expected values below were cross-checked with torch 1.13 on x86-64.
TEST(Convert, FloatToIntegerTruncatesLikeTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  F32 f = {2.7f, -2.7f, -0.5f, 1e10f, nan, 300.75f, -1.0f, inf};
  EXPECT_EQ((conv<int64_t>(f, DType::Float32, DType::Int64)),
            (I64{2, -2, 0, 10000000000, INT64_MIN, 300, -1, INT64_MIN}));
  EXPECT_EQ((conv<int32_t>(f, DType::Float32, DType::Int32)),
            (I32{2, -2, 0, INT32_MIN, INT32_MIN, 300, -1, INT32_MIN}));
  EXPECT_EQ((conv<uint8_t>(f, DType::Float32, DType::UInt8)), (U8{2, 254, 0, 0, 0, 44, 255, 0}));
  F64 d = {3e9 + 7, -1000.5, 2147483648.0 + 5, -2147483648.0, 1e300};
  EXPECT_EQ((conv<uint8_t>(d, DType::Float64, DType::UInt8)), (U8{7, 24, 5, 0, 0}));
  EXPECT_EQ((conv<int32_t>(d, DType::Float64, DType::Int32)), (I32{INT32_MIN, -1000, INT32_MIN, INT32_MIN, INT32_MIN}));
  EXPECT_EQ((conv<int64_t>(d, DType::Float64, DType::Int64)),
            (I64{3000000007, -1000, 2147483653, -2147483648LL, INT64_MIN}));
}

TEST(Convert, AnythingToBoolIsNonZero) {
  F32 f = {0.0f, -0.0f, 0.1f, std::numeric_limits<float>::quiet_NaN(), -INFINITY, 0x1p-149f};
  EXPECT_EQ((conv<uint8_t>(f, DType::Float32, DType::Bool)), (U8{0, 0, 1, 1, 1, 1}));
  U16 h = {0x0000, 0x8000, 0x0001, 0x7e00, 0xfc00};
  EXPECT_EQ((conv<uint8_t>(h, DType::Float16, DType::Bool)), (U8{0, 0, 1, 1, 1}));
  EXPECT_EQ((conv<uint8_t>(h, DType::BFloat16, DType::Bool)), (U8{0, 0, 1, 1, 1}));
  I64 i = {0, -1, INT64_MIN, 256};
  EXPECT_EQ((conv<uint8_t>(i, DType::Int64, DType::Bool)), (U8{0, 1, 1, 1}));
  U8 raw_bools = {0, 1, 2, 255};  // a bool buffer holding non-canonical bytes still reads as != 0
  EXPECT_EQ((conv<float>(raw_bools, DType::Bool, DType::Float32)), (F32{0, 1, 1, 1}));
  EXPECT_EQ((conv<uint16_t>(raw_bools, DType::Bool, DType::Float16)), (U16{0, 0x3c00, 0x3c00, 0x3c00}));
  EXPECT_EQ((conv<uint16_t>(raw_bools, DType::Bool, DType::BFloat16)), (U16{0, 0x3f80, 0x3f80, 0x3f80}));
}

TEST(Convert, SixteenBitToOtherDTypesGoesThroughFloat) {
  U16 h = {0x7bff, 0xc100, 0x7e00, 0x7c00, 0x0001, 0x8000};  // 65504, -2.5, NaN, inf, 2^-24, -0
  F64 d = conv<double>(h, DType::Float16, DType::Float64);
  EXPECT_EQ(d[0], 65504.0);
  EXPECT_EQ(d[1], -2.5);
  EXPECT_TRUE(std::isnan(d[2]));
  EXPECT_EQ(d[3], INFINITY);
  EXPECT_EQ(d[4], 0x1p-24);
  EXPECT_TRUE(d[5] == 0 && std::signbit(d[5]));
  EXPECT_EQ((conv<int32_t>(h, DType::Float16, DType::Int32)), (I32{65504, -2, INT32_MIN, INT32_MIN, 0, 0}));
  EXPECT_EQ((conv<uint8_t>(h, DType::Float16, DType::UInt8)), (U8{224, 254, 0, 0, 0, 0}));
  EXPECT_EQ((conv<uint16_t>(h, DType::Float16, DType::BFloat16)),
            (U16{0x4780, 0xc020, 0x7fc0, 0x7f80, 0x3380, 0x8000}));
  U16 b = {0x4780, 0x3f81, 0x3380, 0x3300, 0xff80, 0x7fc1};  // 65536, 1+2^-7, 2^-24, 2^-25, -inf, NaN
  EXPECT_EQ((conv<uint16_t>(b, DType::BFloat16, DType::Float16)),
            (U16{0x7c00, 0x3c08, 0x0001, 0x0000, 0xfc00, 0x7e08}));
  EXPECT_EQ((conv<int64_t>(b, DType::BFloat16, DType::Int64)), (I64{65536, 1, 0, 0, INT64_MIN, INT64_MIN}));
  // float64 and int64 round to float32 first, as torch does: 1 + 2^-11 + 2^-40 ties at float32 and goes to 1.0.
  F64 wide = {1.0 + 0x1p-11 + 0x1p-40, 65519.99, 1e300, -1e-300};
  EXPECT_EQ((conv<uint16_t>(wide, DType::Float64, DType::Float16)), (U16{0x3c00, 0x7bff, 0x7c00, 0x8000}));
  EXPECT_EQ((conv<uint16_t>(wide, DType::Float64, DType::BFloat16)), (U16{0x3f80, 0x4780, 0x7f80, 0x8000}));
  I64 ints = {(int64_t{1} << 40) + (int64_t{1} << 32) + 1, -3, 70000, -2048, 2049};
  EXPECT_EQ((conv<uint16_t>(ints, DType::Int64, DType::BFloat16)), (U16{0x5380, 0xc040, 0x4789, 0xc500, 0x4500}));
  EXPECT_EQ((conv<uint16_t>(ints, DType::Int64, DType::Float16)), (U16{0x7c00, 0xc200, 0x7c00, 0xe800, 0x6800}));
  EXPECT_EQ((conv<uint16_t>(U8{255, 0}, DType::UInt8, DType::Float16)), (U16{0x5bf8, 0}));
  EXPECT_EQ((conv<uint16_t>(I32{-7, 1 << 24}, DType::Int32, DType::BFloat16)), (U16{0xc0e0, 0x4b80}));
}

TEST(Convert, IntegerAndWideFloatPairs) {
  EXPECT_EQ((conv<int32_t>(I64{(int64_t{1} << 31) + 5, -1}, DType::Int64, DType::Int32)), (I32{-2147483643, -1}));
  EXPECT_EQ((conv<uint8_t>(I64{-5, (int64_t{1} << 40) + 1, 256}, DType::Int64, DType::UInt8)), (U8{251, 1, 0}));
  EXPECT_EQ((conv<int64_t>(I32{-1, INT32_MIN}, DType::Int32, DType::Int64)), (I64{-1, INT32_MIN}));
  EXPECT_EQ((conv<int32_t>(U8{200, 255}, DType::UInt8, DType::Int32)), (I32{200, 255}));
  EXPECT_EQ((conv<float>(I32{16777217, -16777219}, DType::Int32, DType::Float32)), (F32{16777216.0f, -16777220.0f}));
  EXPECT_EQ((conv<double>(I64{(int64_t{1} << 53) + 1}, DType::Int64, DType::Float64)), (F64{0x1p53}));
  EXPECT_EQ((conv<float>(F64{0.1, 1e300, -1e-300}, DType::Float64, DType::Float32)), (F32{0.1f, INFINITY, -0.0f}));
  EXPECT_EQ((conv<double>(F32{0.1f}, DType::Float32, DType::Float64)), (F64{static_cast<double>(0.1f)}));
  EXPECT_EQ((conv<int64_t>(I64{5, -6}, DType::Int64, DType::Int64)), (I64{5, -6}));
}

TEST(Convert, UnknownDTypeThrows) {
  float x = 1;
  uint16_t y = 0;
  EXPECT_THROW(convert(&x, static_cast<DType>(kNumDTypes), &y, DType::Float16, 1), Error);
}

}  // namespace
}  // namespace castor
