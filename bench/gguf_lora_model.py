"""A Llama-3-8B-shaped GGUF file of random blocks in llama-quantize's Q4_K_M mix (tests/oracle/gguf_writer.py's
matrix_type: Q4_K, attn_v and ffn_down Q6_K in the layers use_more_bits picks, output.weight Q6_K), for
bench/gguf_lora_memory.sh: random bytes with each block's float16 scales set small (values of a few hundredths), 1-D
tensors f32 ones, and gguf_writer.py's SentencePiece-style vocabulary; written tensor by tensor.

  gguf_lora_model.py OUT.gguf LAYERS DIM FF HEADS KV_HEADS VOCAB
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
from gguf_writer import GGML, ggml, matrix_type, model_keys, write_file  # noqa: E402

# Where each type's float16 scales lie in its block (ggml-common.h: block_q4_K's d, dmin; block_q6_K's d last).
SCALES = {"q4_k": (144, [0, 2]), "q6_k": (210, [208])}


def random_blocks(kind, rows, cols, seed):
    def make():
        size, at = SCALES[kind]
        n = ggml().ggml_row_size(GGML[kind], cols) * rows // size
        b = np.random.default_rng(seed).integers(0, 256, size=(n, size), dtype=np.uint8)
        for i in at:
            b[:, i:i + 2] = np.frombuffer(np.float16(2e-5 if kind == "q6_k" else 1e-4).tobytes(), dtype=np.uint8)
        return b.tobytes()
    return make


def main():
    out, layers, dim, ff, heads, kv_heads, vocab = sys.argv[1], *map(int, sys.argv[2:8])
    cfg = {"vocab_size": vocab, "hidden_size": dim, "intermediate_size": ff, "num_hidden_layers": layers,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
    kv_dim = dim // heads * kv_heads
    ones = lambda n: np.ones(n, dtype=np.float32).tobytes()  # noqa: E731
    tensors = []
    def matrix(name, rows, cols):
        kind = matrix_type("q4_k_m", name, layers, tied=False)
        tensors.append((name, [cols, rows], GGML[kind], random_blocks(kind, rows, cols, len(tensors))))
    matrix("token_embd.weight", vocab, dim)
    for i in range(layers):
        tensors.append((f"blk.{i}.attn_norm.weight", [dim], 0, ones(dim)))
        for name, rows, cols in [("attn_q", dim, dim), ("attn_k", kv_dim, dim), ("attn_v", kv_dim, dim),
                                 ("attn_output", dim, dim), ("ffn_gate", ff, dim), ("ffn_up", ff, dim),
                                 ("ffn_down", dim, ff)]:
            matrix(f"blk.{i}.{name}.weight", rows, cols)
        tensors.append((f"blk.{i}.ffn_norm.weight", [dim], 0, ones(dim)))
    tensors.append(("output_norm.weight", [dim], 0, ones(dim)))
    matrix("output.weight", vocab, dim)
    write_file(out, model_keys("llama", cfg, heads, kv_heads), tensors)


if __name__ == "__main__":
    main()
