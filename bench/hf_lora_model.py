"""A Llama-shaped Hugging Face directory of random bfloat16 weights (config.json, model.safetensors.index.json and its
shards of about 2 GB), for bench/gguf_lora_memory.sh's `--quantize-base nf4` row: each value a random sign and
mantissa with exponent -7 (magnitudes in [1/128, 1/64)), norms ones; written tensor by tensor, never held whole.

  hf_lora_model.py OUT_DIR LAYERS DIM FF HEADS KV_HEADS VOCAB
"""
import json
import os
import struct
import sys

import numpy as np

SHARD_BYTES = 2 << 30


def tensor_list(layers, dim, ff, heads, kv_heads, vocab):
    kv_dim = dim // heads * kv_heads
    out = [("model.embed_tokens.weight", [vocab, dim])]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [dim]), (p + "self_attn.q_proj.weight", [dim, dim]),
                (p + "self_attn.k_proj.weight", [kv_dim, dim]), (p + "self_attn.v_proj.weight", [kv_dim, dim]),
                (p + "self_attn.o_proj.weight", [dim, dim]), (p + "post_attention_layernorm.weight", [dim]),
                (p + "mlp.gate_proj.weight", [ff, dim]), (p + "mlp.up_proj.weight", [ff, dim]),
                (p + "mlp.down_proj.weight", [dim, ff])]
    return out + [("model.norm.weight", [dim]), ("lm_head.weight", [vocab, dim])]


def values(name, shape, seed):
    n = int(np.prod(shape))
    if len(shape) == 1:
        return np.full(n, 0x3F80, dtype=np.uint16).tobytes()  # bfloat16 ones
    bits = np.random.default_rng(seed).integers(0, 1 << 16, size=n, dtype=np.uint16)
    return ((bits & 0x807F) | 0x3C00).astype(np.uint16).tobytes()  # sign, exponent 120 (2^-7), random mantissa


def write_shard(path, entries):
    header, offset = {}, 0
    for name, shape, _ in entries:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, shape, seed in entries:
            f.write(values(name, shape, seed))


def main():
    out, layers, dim, ff, heads, kv_heads, vocab = sys.argv[1], *map(int, sys.argv[2:8])
    os.makedirs(out, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
              "intermediate_size": ff, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "torch_dtype": "bfloat16"}
    shards, size = [[]], 0
    for seed, (name, shape) in enumerate(tensor_list(layers, dim, ff, heads, kv_heads, vocab)):
        n = int(np.prod(shape)) * 2
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, seed))
        size += n
    weight_map = {}
    for i, entries in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(out, file), entries)
        weight_map.update({name: file for name, _, _ in entries})
    total = sum(int(np.prod(s)) * 2 for _, s in tensor_list(layers, dim, ff, heads, kv_heads, vocab))
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


if __name__ == "__main__":
    main()
