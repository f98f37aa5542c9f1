// The tiny Llama configuration the Llama tests share: 2 layers, 4 heads of 8 over 2 kv heads (grouped-query
// attention), 32 wide, hidden 96, context 16.
#pragma once
#include <string>

#include "castor/llama.h"

namespace castor::test {

inline models::LlamaConfig tiny_llama_config(int64_t vocab_size, int64_t n_kv_heads = 2, bool tied = true) {
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = n_kv_heads, c.vocab_size = vocab_size;
  c.multiple_of = 16, c.max_seq_len = 16, c.tied = tied;
  return c;
}

// Hugging Face's rope_scaling object (tests/oracle/rope.py reads it), null for none.
inline std::string rope_scaling_json(const F::RopeScaling& r) {
  using Type = F::RopeScaling::Type;
  if (r.type == Type::None) return "null";
  if (r.type == Type::Linear) return detail::cat("{\"rope_type\": \"linear\", \"factor\": ", r.factor, "}");
  return detail::cat("{\"rope_type\": \"llama3\", \"factor\": ", r.factor, ", \"low_freq_factor\": ", r.low_freq_factor,
                     ", \"high_freq_factor\": ", r.high_freq_factor,
                     ", \"original_max_position_embeddings\": ", r.original_max_position_embeddings, "}");
}

// The config as tests/oracle/llama_oracle.py reads it, with `extra` fields (", \"key\": value") appended.
inline std::string llama_config_json(const models::LlamaConfig& c, const std::string& extra = "") {
  return detail::cat(
      "{\"dim\": ", c.dim, ", \"n_layers\": ", c.n_layers, ", \"n_heads\": ", c.n_heads,
      ", \"n_kv_heads\": ", c.kv_heads(), ", \"vocab_size\": ", c.vocab_size, ", \"hidden_dim\": ", c.ffn_hidden_dim(),
      ", \"norm_eps\": ", c.norm_eps, ", \"max_seq_len\": ", c.max_seq_len, ", \"rope_theta\": ", c.rope_theta,
      ", \"tied\": ", c.tied ? "true" : "false", ", \"head_dim\": ", c.head_size(),
      ", \"attention_bias\": ", c.attention_bias ? "true" : "false", ", \"qkv_bias\": ", c.qkv_bias ? "true" : "false",
      ", \"mlp_bias\": ", c.mlp_bias ? "true" : "false", ", \"sliding_window\": ", c.sliding_window,
      ", \"rope_scaling\": ", rope_scaling_json(c.rope_scaling), extra, "}");
}

}  // namespace castor::test
