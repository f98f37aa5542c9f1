"""GGUF v3 files written from a Hugging Face directory (hf_llama_oracle.py write's) as llama.cpp's convert_hf_to_gguf.py
lays them out (docs/gguf.md; written here from the specification, not by Castor's exporter): arch llama (q_proj and
k_proj rows permuted from rotate-half pairs to Meta's interleaved ones, as LlamaModel.permute) or qwen2 (not
permuted, q/k/v biases), 1-D tensors f32, and a SentencePiece-style tokenizer of the model's vocabulary size. TYPE:
every matrix f32, f16 or bf16, or quantized by ggml itself (node-llama-cpp's libggml-base.so through ctypes:
ggml_quantize_chunk, llama-quantize's reference quantizers without an importance matrix) as one type (q4_0, q4_1,
q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k; a matrix whose rows are not whole blocks falls back to f16) or as
q4_k_m, llama-quantize's Q4_K_M mix: Q4_K, but attn_v and ffn_down Q6_K in the layers use_more_bits picks (the
first and last eighth, every third between), output.weight Q6_K, and token_embd Q6_K when it is also the output
(tied), else Q4_K. The directory's weights are then replaced by the values the file holds (float16/bfloat16
rounding, ggml's dequantize_row_* of the blocks, as float32), so hf_llama_oracle.py's logits are the oracle of a
reader of the file.

  gguf_writer.py write HF_DIR OUT.gguf TYPE [CHAT_TEMPLATE [VOCAB.json]]

CHAT_TEMPLATE "" writes none; VOCAB.json ({"tokens", "scores", "types"}, one entry per token of the model's
vocabulary) replaces the generated vocabulary.
"""
import ctypes
import glob
import itertools
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read, write  # noqa: E402

ALIGN = 32
GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
        "q4_k": 12, "q5_k": 13, "q6_k": 14, "bf16": 30}
LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "third_party", "npm-llama-cpp",
                   "node_modules", "@node-llama-cpp", "linux-x64", "bins", "*", "libggml-base.so")


def ggml():
    found = glob.glob(LIB)
    if not found:
        raise SystemExit(f"gguf_writer.py: no {LIB} (scripts/setup_tests.sh installs node-llama-cpp)")
    lib = ctypes.CDLL(found[0])
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    return lib


def quantized(x, kind):
    """ggml's blocks of the float32 matrix x as `kind`, and ggml's dequantization of them."""
    lib, t = ggml(), GGML[kind]
    rows, cols = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = ctypes.create_string_buffer(lib.ggml_row_size(t, cols) * rows)
    n = lib.ggml_quantize_chunk(t, x.ctypes.data, blocks, 0, rows, cols, None)
    assert n == len(blocks.raw), (n, len(blocks.raw))
    name = "dequantize_row_" + (kind[:-1] + "K" if kind.endswith("k") else kind)
    deq = getattr(lib, name)
    deq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    y = np.empty((rows, cols), dtype=np.float32)
    deq(blocks, y.ctypes.data, rows * cols)
    return blocks.raw, y


def use_more_bits(i, n):
    """llama-quant.cpp's choice of the layers that get more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def matrix_type(kind, gg, n_layers, tied):
    """The type TYPE gives the matrix named `gg` (a GGUF name)."""
    if kind != "q4_k_m":
        return kind
    if gg == "output.weight" or (gg == "token_embd.weight" and tied):
        return "q6_k"
    if gg.endswith("attn_v.weight") or gg.endswith("ffn_down.weight"):
        return "q6_k" if use_more_bits(int(gg.split(".")[1]), n_layers) else "q4_k"
    return "q4_k"


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
    return quantized(x, kind)


def model_keys(arch, cfg, heads, kv_heads, given=None):
    """The metadata of a model of Hugging Face config `cfg` as `arch`, with a SentencePiece-style vocabulary of its size:
    <unk>, <s>, </s>, the 256 byte tokens when the vocabulary has room (else the newline's, which llama.cpp's
    SentencePiece vocabulary looks up), then pieces: U+2581 and the letters alone (every longer piece is then a merge
    of two pieces, as in a trained SentencePiece vocabulary), then U+2581 with a letter repeated up to 16 times, then
    (a vocabulary of Llama 3's size: pieces of a few letters, as a real one's, not thousands) U+2581 with the words of
    two to four letters that are not one letter repeated, shorter first."""
    vocab = cfg["vocab_size"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if vocab >= 300 else ["<0x0A>"]
    head_tokens = ["<unk>", "<s>", "</s>"] + byte_tokens
    pieces = vocab - len(head_tokens)
    alone = ["\u2581"] + [chr(0x61 + i) for i in range(26)]
    repeated = ["\u2581" + chr(0x61 + i % 26) * (1 + i // 26) for i in range(min(pieces, 26 * 16))]
    words = ("\u2581" + "".join(w) for n in (2, 3, 4) for w in itertools.product(alone[1:], repeat=n)
             if len(set(w)) > 1)
    tokens = head_tokens + (alone + repeated + list(itertools.islice(words, max(0, pieces - len(repeated)))))[:pieces]
    scores = [0.0] * len(head_tokens) + [-float(i) for i in range(pieces)]
    types = [2, 3, 3] + [6] * len(byte_tokens) + [1] * pieces
    if given:
        tokens, scores, types = given["tokens"], given["scores"], given["types"]
        assert len(tokens) == len(scores) == len(types) == vocab, "VOCAB.json: one entry per token of the model"
    return [("general.architecture", 8, arch), ("general.name", 8, "oracle"), ("general.alignment", 4, ALIGN),
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


def write_file(out, keys, tensors):
    """The GGUF file of `keys` and `tensors` ((name, ne, ggml type, bytes or a function giving them), each written as
    it is made: a file of any size is never held whole)."""
    def size(ne, t):
        n = int(np.prod(ne))
        block, nbytes = {0: (1, 4), 1: (1, 2), 30: (1, 2)}.get(t, (None, None))
        return n * nbytes if block else ggml().ggml_row_size(t, ne[0]) * (n // ne[0])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(kv(*k) for k in keys)
    offset = 0
    for name, ne, t, data in tensors:
        head += string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", t, offset)
        n = len(data) if isinstance(data, bytes) else size(ne, t)
        offset += n + (-n % ALIGN)
    head += b"\0" * (-len(head) % ALIGN)
    with open(out, "wb") as f:
        f.write(head)
        for name, ne, t, data in tensors:
            blob = data if isinstance(data, bytes) else data()
            f.write(blob + b"\0" * (-len(blob) % ALIGN))


def main():
    if len(sys.argv) < 5 or sys.argv[1] != "write":
        raise SystemExit("usage: gguf_writer.py write HF_DIR OUT.gguf f32|f16|bf16|q4_0|...|q6_k|q4_k_m [CHAT_TEMPLATE]")
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
        t = matrix_type(kind, gg, cfg["num_hidden_layers"], "lm_head.weight" not in state) if x.ndim == 2 else "f32"
        block = 256 if t.endswith("k") else 32
        if t not in ("f32", "f16", "bf16") and x.shape[-1] % block != 0:  # (rows not whole blocks: f16)
            t = "f16"
        data, values = stored(x, t)
        if not qwen2 and ("q_proj" in hf or "k_proj" in hf):  # (the values back in Hugging Face's rows)
            h = heads if "q_proj" in hf else kv_heads
            rows = values.shape[0]
            values = values.reshape(h, rows // h // 2, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)
        held[hf] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        tensors.append((gg, list(reversed(x.shape)), GGML[t], data))
    rope = cfg.get("rope_scaling") or {}
    if rope.get("rope_type") == "llama3":  # convert_hf_to_gguf.py's LlamaModel: the per-pair factors, no scaling key
        hd = cfg["hidden_size"] // heads
        inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        factor, low, high = rope["factor"], rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        orig = rope.get("original_max_position_embeddings", 8192)
        factors = []
        for freq in inv.tolist():
            wavelen = 2 * math.pi / freq
            if wavelen < orig / high:
                factors.append(1.0)
            elif wavelen > orig / low:
                factors.append(factor)
            else:
                smooth = (orig / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        tensors.append(("rope_freqs.weight", [len(factors)], 0, np.array(factors, dtype=np.float32).tobytes()))
    keys = model_keys(arch, cfg, heads, kv_heads, json.load(open(sys.argv[6])) if len(sys.argv) > 6 else None)
    if len(sys.argv) > 5 and sys.argv[5]:
        keys.append(("tokenizer.chat_template", 8, sys.argv[5]))
    write_file(out, keys, tensors)
    write(f"{d}/model.safetensors", held, {"format": "pt"})
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(f"{d}/config.json", "w"), indent=2)


if __name__ == "__main__":
    main()
