// CPython's random.Random (Lib/random.py over Modules/_randommodule.c) bit for bit: the Mersenne Twister seeded from a
// non-negative integer as random.seed(n) seeds it, getrandbits, _randbelow and sample's two draws, so that
// lm-evaluation-harness's fewshot examples (random.Random(1234).sample) are drawn as it draws them.
#pragma once
#include <cstdint>
#include <vector>

#include "castor/random.h"

namespace castor::data {

class PyRandom {
 public:
  explicit PyRandom(uint64_t seed);  // random.Random(seed): init_by_array of the seed's 32-bit words, low first
  uint32_t next_u32() { return mt_.next_u32(); }  // genrand_uint32
  uint32_t getrandbits(int k);                    // random.getrandbits(k), k in [0, 32]
  uint32_t randbelow(uint32_t n);  // random._randbelow(n), n >= 1: getrandbits(n.bit_length()) until below n
  // random.sample(range(n), k): k distinct indices in [0, n), drawn from a shrinking pool where an n-element list is
  // smaller than a k-element set (Python's setsize rule), else by rejection from a set. castor::Error when k > n.
  std::vector<int64_t> sample(int64_t n, int64_t k);

 private:
  Mt19937 mt_;
};

}  // namespace castor::data
