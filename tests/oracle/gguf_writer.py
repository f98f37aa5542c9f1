"""GGUF v3 files written from a Hugging Face directory (hf_llama_oracle.py write's) as llama.cpp's convert_hf_to_gguf.py
lays them out (docs/gguf.md; written here from the specification, not by Castor's exporter): arch llama (q_proj and
k_proj rows permuted from rotate-half pairs to Meta's interleaved ones, as LlamaModel.permute) or qwen2 (not
permuted, q/k/v biases), matrices as f32, f16, bf16 or q8_0 (gguf_oracle.py's quantizer), 1-D tensors f32, and a
SentencePiece-style tokenizer of the model's vocabulary size. The directory's weights are then replaced by the values
the file holds (float16/bfloat16 rounding, q8_0 dequantized, as float32), so hf_llama_oracle.py's logits are the
oracle of a reader of the file.

  gguf_writer.py write HF_DIR OUT.gguf TYPE [CHAT_TEMPLATE]
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_oracle import dequantize_q8_0, quantize_q8_0  # noqa: E402
from safetensors_io import read, write  # noqa: E402

ALIGN = 32
GGML = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


def string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, t, v):
    out = string(key) + struct.pack("<I", t)
    if t == 8:
        return out + string(v)
    if t == 9:
        elem, items = v
        out += struct.pack("<IQ", elem, len(items))
        for x in items:
            out += string(x) if elem == 8 else struct.pack({4: "<I", 5: "<i", 6: "<f"}[elem], x)
        return out
    return out + struct.pack({4: "<I", 5: "<i", 6: "<f", 7: "<?"}[t], v)


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: Hugging Face's rotate-half rows to Meta's interleaved ones."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stored(x, kind):
    """The bytes of float32 array x as `kind`, and the float32 values they hold."""
    if kind == "f32":
        return x.tobytes(), x
    if kind == "f16":
        h = x.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if kind == "bf16":
        b = torch.from_numpy(x).to(torch.bfloat16)
        return b.view(torch.int16).numpy().tobytes(), b.float().numpy()
    blocks = quantize_q8_0(x.reshape(-1))
    return blocks, dequantize_q8_0(blocks).reshape(x.shape)


def main():
    if len(sys.argv) < 5 or sys.argv[1] != "write":
        raise SystemExit("usage: gguf_writer.py write HF_DIR OUT.gguf f32|f16|bf16|q8_0 [CHAT_TEMPLATE]")
    d, out, kind = sys.argv[2], sys.argv[3], sys.argv[4]
    cfg = json.load(open(f"{d}/config.json"))
    qwen2 = cfg["architectures"][0] == "Qwen2ForCausalLM"
    arch = "qwen2" if qwen2 else "llama"
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    state = {k: v.float().numpy() for k, v in read(f"{d}/model.safetensors")[0].items()}
    names = [("model.embed_tokens.weight", "token_embd.weight")]
    per = [("input_layernorm.weight", "attn_norm.weight"), ("self_attn.q_proj.weight", "attn_q.weight"),
           ("self_attn.q_proj.bias", "attn_q.bias"), ("self_attn.k_proj.weight", "attn_k.weight"),
           ("self_attn.k_proj.bias", "attn_k.bias"), ("self_attn.v_proj.weight", "attn_v.weight"),
           ("self_attn.v_proj.bias", "attn_v.bias"), ("self_attn.o_proj.weight", "attn_output.weight"),
           ("post_attention_layernorm.weight", "ffn_norm.weight"), ("mlp.gate_proj.weight", "ffn_gate.weight"),
           ("mlp.up_proj.weight", "ffn_up.weight"), ("mlp.down_proj.weight", "ffn_down.weight")]
    for i in range(cfg["num_hidden_layers"]):
        names += [(f"model.layers.{i}.{a}", f"blk.{i}.{b}") for a, b in per]
    names += [("model.norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight")]
    tensors, held = [], {}
    for hf, gg in names:
        if hf not in state:
            continue
        x = np.ascontiguousarray(state[hf], dtype=np.float32)
        if not qwen2 and ("q_proj" in hf or "k_proj" in hf):
            x = np.ascontiguousarray(permute(x, heads if "q_proj" in hf else kv_heads))
        t = kind if x.ndim == 2 else "f32"
        if t == "q8_0" and x.shape[-1] % 32 != 0:  # (rows not whole blocks: f16, as the converter falls back)
            t = "f16"
        data, values = stored(x, t)
        if not qwen2 and ("q_proj" in hf or "k_proj" in hf):  # (the values back in Hugging Face's rows)
            h = heads if "q_proj" in hf else kv_heads
            rows = values.shape[0]
            values = values.reshape(h, rows // h // 2, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)
        held[hf] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        tensors.append((gg, list(reversed(x.shape)), GGML[t], data))
    vocab = cfg["vocab_size"]
    # <unk>, <s>, </s>, the 256 byte tokens when the vocabulary has room (else the newline's, which llama.cpp's
    # SentencePiece vocabulary looks up), then pieces.
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if vocab >= 300 else ["<0x0A>"]
    head_tokens = ["<unk>", "<s>", "</s>"] + byte_tokens
    pieces = vocab - len(head_tokens)
    tokens = head_tokens + ["\u2581" + chr(0x61 + i % 26) * (1 + i // 26) for i in range(pieces)]
    scores = [0.0] * len(head_tokens) + [-float(i) for i in range(pieces)]
    types = [2, 3, 3] + [6] * len(byte_tokens) + [1] * pieces
    keys = [("general.architecture", 8, arch), ("general.name", 8, "oracle"), ("general.alignment", 4, ALIGN),
            (f"{arch}.context_length", 4, cfg["max_position_embeddings"]),
            (f"{arch}.embedding_length", 4, cfg["hidden_size"]),
            (f"{arch}.block_count", 4, cfg["num_hidden_layers"]),
            (f"{arch}.feed_forward_length", 4, cfg["intermediate_size"]),
            (f"{arch}.rope.dimension_count", 4, cfg["hidden_size"] // heads),
            (f"{arch}.attention.head_count", 4, heads), (f"{arch}.attention.head_count_kv", 4, kv_heads),
            (f"{arch}.attention.layer_norm_rms_epsilon", 6, cfg["rms_norm_eps"]),
            (f"{arch}.rope.freq_base", 6, cfg.get("rope_theta", 10000.0)),
            ("tokenizer.ggml.model", 8, "llama"), ("tokenizer.ggml.tokens", 9, (8, tokens)),
            ("tokenizer.ggml.scores", 9, (6, scores)), ("tokenizer.ggml.token_type", 9, (5, types)),
            ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
            ("tokenizer.ggml.unknown_token_id", 4, 0), ("tokenizer.ggml.add_bos_token", 7, True)]
    if len(sys.argv) > 5:
        keys.append(("tokenizer.chat_template", 8, sys.argv[5]))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(kv(*k) for k in keys)
    offset, blobs = 0, b""
    for name, ne, t, data in tensors:
        head += string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", t, offset)
        blob = data + b"\0" * (-len(data) % ALIGN)
        blobs += blob
        offset += len(blob)
    head += b"\0" * (-len(head) % ALIGN)
    open(out, "wb").write(head + blobs)
    write(f"{d}/model.safetensors", held, {"format": "pt"})
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(f"{d}/config.json", "w"), indent=2)


if __name__ == "__main__":
    main()
