// CPython's random.seed, getrandbits, _randbelow and sample over castor::Mt19937 (text/py_random.h).
#include "text/py_random.h"

#include <bit>
#include <cmath>

#include "castor/check.h"

namespace castor::data {

PyRandom::PyRandom(uint64_t seed) {
  std::vector<uint32_t> key{static_cast<uint32_t>(seed)};
  if (seed >> 32) key.push_back(static_cast<uint32_t>(seed >> 32));
  mt_.seed_by_array(key);
}

uint32_t PyRandom::getrandbits(int k) {
  CASTOR_ASSERT(k >= 0 && k <= 32, "getrandbits: k ", k);
  return k == 0 ? 0u : next_u32() >> (32 - k);
}

uint32_t PyRandom::randbelow(uint32_t n) {
  CASTOR_ASSERT(n >= 1, "randbelow(0)");
  const int k = std::bit_width(n);
  uint32_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<int64_t> PyRandom::sample(int64_t n, int64_t k) {
  CASTOR_CHECK(k >= 0 && k <= n, "a sample of ", k, " from ", n, " rows: larger than the population");
  CASTOR_CHECK(n < (int64_t{1} << 32), "a sample from ", n, " rows: more than 2^32");
  std::vector<int64_t> out(static_cast<size_t>(k));
  int64_t setsize = 21;  // (Python's: the size of a small set minus that of an empty list)
  if (k > 5) setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(3.0 * k) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = randbelow(static_cast<uint32_t>(n - i));
      out[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
    return out;
  }
  std::vector<bool> selected(static_cast<size_t>(n));
  for (int64_t i = 0; i < k; ++i) {
    int64_t j = randbelow(static_cast<uint32_t>(n));
    while (selected[j]) j = randbelow(static_cast<uint32_t>(n));
    selected[j] = true;
    out[i] = j;
  }
  return out;
}

}  // namespace castor::data
