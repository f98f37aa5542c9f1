// A seedable random generator whose state can be saved and restored, and the random factories built on it.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "castor/tensor.h"

namespace castor {

// Philox-free and simple: xoshiro256** seeded through splitmix64. The state is four 64-bit words.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);
  uint64_t next_u64();
  double next_double();  // uniform in [0, 1) with 53 random bits
  float next_float();    // uniform in [0, 1) with 24 random bits
  double next_normal();  // standard normal (Box-Muller, both values used)
  // Advances the state as n calls of next_u64 would, in O(log n) (as std::mersenne_twister_engine::discard).
  void discard(uint64_t n);
  // Advances the state as n calls of next_normal would (only the last pair is transformed, for the cached value).
  void discard_normals(int64_t n);

  using State = std::array<uint64_t, 6>;  // xoshiro words, a cached-normal flag and the cached normal's bits
  State state() const;
  void set_state(const State& s);

 private:
  friend void normal_(const Tensor& t, double mean, double std, Generator* gen);  // reads the cached normal
  std::array<uint64_t, 4> s_{};
  bool has_cached_normal_ = false;
  double cached_normal_ = 0.0;
};

// The 32-bit Mersenne Twister (MT19937) as PyTorch's CPU generator and llm.c's llmc/rand.h seed and run it:
// manual_seed(s) fills the 624 words from s by Knuth's multiplier 1812433253, the first draw twists them.
class Mt19937 {
 public:
  explicit Mt19937(uint32_t seed = 5489) { manual_seed(seed); }
  void manual_seed(uint32_t seed);
  // The reference init_by_array(key): manual_seed(19650218), then the key mixed in (CPython's random.seed of an
  // integer: its 32-bit words, low first).
  void seed_by_array(const std::vector<uint32_t>& key);
  uint32_t next_u32();

 private:
  std::array<uint32_t, 624> mt_{};
  size_t index_ = 624;  // the next word to temper; 624: twist first
};

// The process-wide default generator (torch.manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor rand(const Shape& shape, DType dtype = DType::Float32, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, DType dtype = DType::Float32, Generator* gen = nullptr);  // N(0, 1)
Tensor uniform(const Shape& shape, double low, double high, DType dtype = DType::Float32, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, DType dtype = DType::Float32, Generator* gen = nullptr);
// t's values replaced in place by normal(t.shape(), mean, std, t.dtype(), gen)'s, bumping its version as fill_ does
// (a contiguous floating-point tensor; a parameter under no_grad, as torch.nn.init.normal_).
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
Tensor bernoulli(const Shape& shape, double p, DType dtype = DType::Float32, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen = nullptr);  // int64 in [low, high)
Tensor randperm(int64_t n, Generator* gen = nullptr);                                     // int64

}  // namespace castor
