// The tiny Llama configuration the Llama tests share: 2 layers, 4 heads of 8 over 2 kv heads (grouped-query
// attention), 32 wide, hidden 96, context 16.
#pragma once
#include "castor/llama.h"

namespace castor::test {

inline models::LlamaConfig tiny_llama_config(int64_t vocab_size, int64_t n_kv_heads = 2, bool tied = true) {
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = n_kv_heads, c.vocab_size = vocab_size;
  c.multiple_of = 16, c.max_seq_len = 16, c.tied = tied;
  return c;
}

}  // namespace castor::test
