// The 32-bit Mersenne Twister (castor/random.h's Mt19937): PyTorch's and llm.c's seeding, the reference init_by_array
// (CPython's random.seed), and the tempered draw. Apart from random.cpp so the fuzz build's parsers link it alone.
#include <algorithm>

#include "castor/check.h"
#include "castor/random.h"

namespace castor {

void Mt19937::manual_seed(uint32_t seed) {
  mt_[0] = seed;
  for (uint32_t i = 1; i < mt_.size(); ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  index_ = mt_.size();
}

void Mt19937::seed_by_array(const std::vector<uint32_t>& key) {
  CASTOR_ASSERT(!key.empty(), "seed_by_array: an empty key");
  constexpr int n = 624;
  manual_seed(19650218u);
  const int len = static_cast<int>(key.size());
  int i = 1, j = 0;
  for (int k = std::max(n, len); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    if (++i >= n) mt_[0] = mt_[n - 1], i = 1;
    if (++j >= len) j = 0;
  }
  for (int k = n - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    if (++i >= n) mt_[0] = mt_[n - 1], i = 1;
  }
  mt_[0] = 0x80000000u;  // (a non-zero state assured)
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

}  // namespace castor
