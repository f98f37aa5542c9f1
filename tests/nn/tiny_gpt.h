// The tiny GPT configuration the GPT tests share (2 layers, 2 heads, 32 wide, block 16), and its config as the oracle reads it.
#pragma once
#include <string>

#include "castor/models.h"

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

}  // namespace castor::test
