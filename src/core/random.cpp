// The xoshiro256** generator and the random tensor factories.
#include "castor/random.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <tuple>
#include <utility>

#include "castor/convert.h"
#include "core/parallel.h"

namespace castor {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
double unit_double(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Box-Muller on two draws, u1 = 1 - U(a) in (0, 1] and u2 = U(b): the pair (r cos, r sin).
std::pair<double, double> box_muller(uint64_t a, uint64_t b) {
  const double u1 = 1.0 - unit_double(a), u2 = unit_double(b);
  const double r = std::sqrt(-2.0 * std::log(u1));
  return {r * std::cos(2.0 * M_PI * u2), r * std::sin(2.0 * M_PI * u2)};
}
}  // namespace

void Generator::manual_seed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
  has_cached_normal_ = false;
}

uint64_t Generator::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Generator::next_double() { return unit_double(next_u64()); }
float Generator::next_float() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

double Generator::next_normal() {
  if (has_cached_normal_) {
    has_cached_normal_ = false;
    return cached_normal_;
  }
  const uint64_t a = next_u64();
  const auto [first, second] = box_muller(a, next_u64());
  cached_normal_ = second;
  has_cached_normal_ = true;
  return first;
}

void Generator::discard_normals(int64_t n) {
  if (n > 0 && has_cached_normal_) {
    has_cached_normal_ = false;
    --n;
  }
  if (n == 0) return;
  discard(2 * static_cast<uint64_t>((n - 1) / 2));  // every pair but the last
  next_normal();
  if (n % 2 == 0) next_normal();
}

namespace {
// xoshiro256's state transition T is linear over GF(2) and its characteristic polynomial P (degree 256) is
// primitive, so n steps are T^n = (x^n mod P)(T): the state after n steps is the xor of the states after i steps,
// 0 <= i < 256, for the coefficients of x^n mod P that are 1. A polynomial of degree < 256 is four words, bit i of
// the whole the coefficient of x^i.
using Poly = std::array<uint64_t, 4>;

bool coefficient(const Poly& a, int i) { return (a[i / 64] >> (i % 64)) & 1; }

// P's coefficients below x^256: the shortest recurrence (Berlekamp-Massey) of one state bit over 512 steps, which is
// P's as P is primitive.
const Poly& transition_polynomial() {
  static const Poly p = [] {
    constexpr int L = 256, N = 2 * L;
    Generator g(0);
    std::array<uint8_t, N> bits;
    for (auto& bit : bits) {
      bit = g.state()[0] & 1;
      g.next_u64();
    }
    // c: the recurrence bit[n] = sum c[i] bit[n - i] found so far (c[0] = 1); b: c before its last length change.
    std::array<uint8_t, N + 1> c{}, b{};
    c[0] = b[0] = 1;
    int len = 0, changed_at = -1;
    for (int n = 0; n < N; ++n) {
      uint8_t discrepancy = bits[n];
      for (int i = 1; i <= len; ++i) discrepancy ^= c[i] & bits[n - i];
      if (!discrepancy) continue;
      const auto before = c;
      for (int i = 0; i + n - changed_at <= N; ++i) c[i + n - changed_at] ^= b[i];
      if (2 * len <= n) {
        len = n + 1 - len;
        changed_at = n;
        b = before;
      }
    }
    CASTOR_ASSERT(len == L, "xoshiro256's state bit has a recurrence of length ", len, ", not ", L);
    Poly low{};  // P(x) = x^256 + sum c[i] x^(256 - i)
    for (int i = 1; i <= L; ++i) low[(L - i) / 64] |= uint64_t{c[static_cast<size_t>(i)]} << ((L - i) % 64);
    return low;
  }();
  return p;
}

Poly times_x(Poly a) {  // a x mod P
  const bool carry = a[3] >> 63;
  for (int w = 3; w > 0; --w) a[w] = (a[w] << 1) | (a[w - 1] >> 63);
  a[0] <<= 1;
  if (carry)
    for (int w = 0; w < 4; ++w) a[w] ^= transition_polynomial()[w];
  return a;
}

Poly times(const Poly& a, const Poly& b) {  // a b mod P, by Horner's rule over b's coefficients
  Poly r{};
  for (int i = 255; i >= 0; --i) {
    r = times_x(r);
    if (coefficient(b, i))
      for (int w = 0; w < 4; ++w) r[w] ^= a[w];
  }
  return r;
}
}  // namespace

void Generator::discard(uint64_t n) {
  Poly r{1, 0, 0, 0};  // x^n mod P, squaring from n's top bit down
  for (int bit = std::bit_width(n) - 1; bit >= 0; --bit) {
    r = times(r, r);
    if ((n >> bit) & 1) r = times_x(r);
  }
  std::array<uint64_t, 4> sum{};
  for (int i = 0; i < 256; ++i, next_u64())
    if (coefficient(r, i))
      for (int w = 0; w < 4; ++w) sum[w] ^= s_[w];
  s_ = sum;
}

Generator::State Generator::state() const {
  uint64_t bits;
  std::memcpy(&bits, &cached_normal_, 8);
  return {s_[0], s_[1], s_[2], s_[3], has_cached_normal_, bits};
}

void Generator::set_state(const State& s) {
  // xoshiro never reaches the all-zero state, and from it draws only zeros.
  CASTOR_CHECK(s[0] | s[1] | s[2] | s[3],
               "Generator::set_state: the xoshiro words are all zero, not a state a "
               "generator reaches");
  for (int i = 0; i < 4; ++i) s_[i] = s[i];
  has_cached_normal_ = s[4] != 0;
  std::memcpy(&cached_normal_, &s[5], 8);
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
template <class F>
Tensor generate(const Shape& shape, DType dtype, Generator* gen, F draw) {
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = shape_numel(shape);
  std::unique_ptr<double[]> v(new double[n]);
  for (int64_t i = 0; i < n; ++i) v[i] = draw(g);
  Tensor t = empty(shape, dtype);
  convert(v.get(), DType::Float64, t.data_ptr(), dtype, n);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, DType dtype, Generator* gen) { return uniform(shape, 0.0, 1.0, dtype, gen); }
Tensor randn(const Shape& shape, DType dtype, Generator* gen) { return normal(shape, 0.0, 1.0, dtype, gen); }

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Generator* gen) {
  CASTOR_CHECK(low <= high, "uniform: low ", low, " > high ", high);
  return generate(shape, dtype, gen, [&](Generator& g) { return low + (high - low) * g.next_double(); });
}

Tensor normal(const Shape& shape, double mean, double std, DType dtype, Generator* gen) {
  Tensor t = empty(shape, dtype);
  normal_(t, mean, std, gen);
  return t;
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  CASTOR_CHECK(std >= 0, "normal: std must be non-negative, got ", std);
  CASTOR_CHECK(is_floating(t.dtype()) && t.is_contiguous(),
               "normal_: expected a contiguous floating-point tensor, got ", t.describe());
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = t.numel();
  char* dst = static_cast<char*>(t.data_ptr());
  const size_t size = dtype_size(t.dtype());
  auto store = [&](double* v, int64_t at, int64_t count) {  // values [at, at + count), standard normals in v
    for (int64_t k = 0; k < count; ++k) v[k] = mean + std * v[k];
    convert_serial(v, DType::Float64, dst + at * size, t.dtype(), static_cast<size_t>(count));
  };
  int64_t at = 0;
  auto one_by_one = [&](int64_t count) {
    double v[kBlock];
    for (int64_t m; count > 0; count -= m, at += m) {
      m = std::min(kBlock, count);
      for (int64_t k = 0; k < m; ++k) v[k] = g.next_normal();
      store(v, at, m);
    }
  };
  if (n > kParallelGrain && omp_get_max_threads() > 1) {
    // The pairs before the last on all threads, each from its own copy of g jumped to its first pair's draws;
    // the last through next_normal on g, jumped past the others, which leaves g as n calls of next_normal do.
    if (g.has_cached_normal_) one_by_one(1);
    const int64_t pairs = (n - at - 1) / 2, first_value = at;
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = pairs * id / threads, end = pairs * (id + 1) / threads;
      Generator own = g;
      own.discard(2 * static_cast<uint64_t>(begin));
      double v[kBlock];
      for (int64_t p = begin, m; p < end; p += m) {
        m = std::min(kBlock / 2, end - p);
        for (int64_t k = 0; k < m; ++k) {
          const uint64_t a = own.next_u64();
          std::tie(v[2 * k], v[2 * k + 1]) = box_muller(a, own.next_u64());
        }
        store(v, first_value + 2 * p, 2 * m);
      }
    }
    g.discard(2 * static_cast<uint64_t>(pairs));
    at += 2 * pairs;
  }
  one_by_one(n - at);
  t.bump_version();
}

Tensor bernoulli(const Shape& shape, double p, DType dtype, Generator* gen) {
  CASTOR_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return generate(shape, dtype, gen, [&](Generator& g) { return g.next_double() < p ? 1.0 : 0.0; });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen) {
  CASTOR_CHECK(low < high, "randint: low ", low, " must be below high ", high);
  const uint64_t range = static_cast<uint64_t>(high - low);
  Generator& g = gen ? *gen : default_generator();
  Tensor t = empty(shape, DType::Int64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = low + static_cast<int64_t>(g.next_u64() % range);
  return t;
}

Tensor randperm(int64_t n, Generator* gen) {
  CASTOR_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  Generator& g = gen ? *gen : default_generator();
  Tensor t = empty({n}, DType::Int64);
  int64_t* p = t.data<int64_t>();
  std::iota(p, p + n, 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[g.next_u64() % static_cast<uint64_t>(i + 1)]);
  return t;
}

}  // namespace castor
