// The xoshiro256** generator and the random tensor factories.
#include "castor/random.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
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

void Generator::fill_normal(double* out, int64_t n) {
  int64_t i = 0;
  if (n > 0 && has_cached_normal_) out[i++] = next_normal();
  // The rest in pairs as next_normal makes them, a chunk at a time: the draws in order here, then the transforms on
  // all threads.
  const int64_t pairs = (n - i + 1) / 2, chunk = int64_t{1} << 20;
  std::unique_ptr<uint64_t[]> draws(new uint64_t[2 * std::min(pairs, chunk)]);
  double last = 0;  // the last pair's second value, cached as next_normal caches it (and kept once used)
  for (int64_t first_pair = 0; first_pair < pairs; first_pair += chunk) {
    const int64_t m = std::min(chunk, pairs - first_pair);
    for (int64_t k = 0; k < 2 * m; ++k) draws[k] = next_u64();
    parallel_blocks(m, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const auto [first, second] = box_muller(draws[2 * k], draws[2 * k + 1]);
        const int64_t at = i + 2 * (first_pair + k);
        out[at] = first;
        if (at + 1 < n) out[at + 1] = second;
        if (first_pair + k == pairs - 1) last = second;
      }
    });
  }
  if (pairs > 0) {
    cached_normal_ = last;
    has_cached_normal_ = (n - i) % 2 != 0;
  }
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

void Mt19937::manual_seed(uint32_t seed) {
  mt_[0] = seed;
  for (uint32_t i = 1; i < mt_.size(); ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  index_ = mt_.size();
}

uint32_t Mt19937::next_u32() {
  constexpr size_t n = 624, m = 397;
  if (index_ == n) {
    // Each word takes the top bit of itself and the low 31 of the next, shifted, xored with the word m ahead.
    for (size_t i = 0; i < n; ++i) {
      const uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % n] & 0x7fffffffu);
      mt_[i] = mt_[(i + m) % n] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
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
  CASTOR_CHECK(std >= 0, "normal: std must be non-negative, got ", std);
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = shape_numel(shape);
  std::unique_ptr<double[]> v(new double[n]);
  g.fill_normal(v.get(), n);
  Tensor t = empty(shape, dtype);
  char* dst = static_cast<char*>(t.data_ptr());
  const size_t size = dtype_size(dtype);
  parallel_blocks(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) v[i] = mean + std * v[i];
    convert(v.get() + begin, DType::Float64, dst + begin * size, dtype, end - begin);
  });
  return t;
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
