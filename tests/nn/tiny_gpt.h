// The tiny GPT configuration the GPT tests share (2 layers, 2 heads, 32 wide, block 16), and their helpers.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "castor/models.h"
#include "castor/random.h"

namespace castor::test {

inline models::GPTConfig tiny_gpt_config(int64_t vocab_size) {
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = vocab_size;
  return c;
}

// The config as tests/oracle/gpt_oracle.py reads it, with `extra` fields (", \"key\": value") appended.
inline std::string gpt_config_json(const models::GPTConfig& c, const std::string& extra = "") {
  return detail::cat("{\"n_layer\": ", c.n_layer, ", \"n_head\": ", c.n_head, ", \"n_embd\": ", c.n_embd,
                     ", \"block_size\": ", c.block_size, ", \"vocab_size\": ", c.vocab_size,
                     ", \"bias\": ", c.bias ? "true" : "false", extra, "}");
}

// (b, t) int64 token ids in [0, vocab).
inline Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v(b * t);
  for (double& x : v) x = std::floor(gen.next_double() * vocab);
  return tensor(v, Shape{b, t}, DType::Int64);
}

// ||a - b|| / ||b||.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += y[i] * y[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace castor::test
