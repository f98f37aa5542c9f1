// The tiny GPT configuration the GPT tests share: 2 layers, 2 heads, 32 wide, block 16.
#pragma once
#include "castor/models.h"

namespace castor::test {

inline models::GPTConfig tiny_gpt_config(int64_t vocab_size) {
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = vocab_size;
  return c;
}

}  // namespace castor::test
