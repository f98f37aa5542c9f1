"""llama2.c file oracle for tests/train/llama2c_test.cpp, written from llama2.c's export.py (the layouts) and run.c
(read_checkpoint, memory_map_weights and forward), independently of Castor's reader and writer.

  llama2c_oracle.py write CONFIG DIR
      random weights with llama2.c's names laid out by hand as export.py's legacy_export (DIR/v0.bin) and
      version1_export (DIR/v1.bin) would write them; DIR/expected.bin (an oracle case) holds the tensors, and
      "freq_cis_real"/"freq_cis_imag", model.py's precompute_freqs_cis tables. CONFIG is a JSON object: dim,
      hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len, shared (bool), theta, seed.
  llama2c_oracle.py read FILE OUT
      reads FILE as run.c does (v0: 7-int header, negative vocab_size for an unshared classifier, the weights at
      memory_map_weights' offsets) or, when it opens with "ak42", as version1_export wrote it; checks the file's size
      is exactly what the header implies; OUT (an oracle case) holds the tensors with llama2.c's names
      (output.weight: run.c's wcls), v0's tables as freq_cis_real/imag beside "want_freq_cis_real"/"..._imag"
      (precompute_freqs_cis at theta 10000), and "header" (int64: the 7 fields, vocab_size as in the file, then
      shared, version).
  llama2c_oracle.py forward FILE TOKENS OUT
      run.c's forward pass (one position at a time with its KV cache: rmsnorm eps 1e-5, RoPE with run.c's
      on-the-fly angles, grouped-query attention, SwiGLU) in float64 over the comma-separated TOKENS; OUT holds
      "logits" (T, vocab_size).
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import write_case  # noqa: E402

MAGIC = 0x616B3432
KINDS_V0 = ["attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"]
PREFIX = {"attention_norm": "", "ffn_norm": "", "wq": "attention.", "wk": "attention.", "wv": "attention.",
          "wo": "attention.", "w1": "feed_forward.", "w2": "feed_forward.", "w3": "feed_forward."}


def layer_name(i, kind):
    return f"layers.{i}.{PREFIX[kind]}{kind}.weight"


def shapes(c):
    dim, hidden, hs = c["dim"], c["hidden_dim"], c["dim"] // c["n_heads"]
    kv = c["n_kv_heads"] * hs
    return {"attention_norm": (dim,), "ffn_norm": (dim,), "wq": (dim, dim), "wk": (kv, dim), "wv": (kv, dim),
            "wo": (dim, dim), "w1": (hidden, dim), "w2": (dim, hidden), "w3": (hidden, dim)}


def precompute_freqs_cis(head_size, end, theta):
    # model.py's, in float32 as torch computes it there
    freqs = 1.0 / (theta ** (torch.arange(0, head_size, 2)[: head_size // 2].float() / head_size))
    angles = torch.outer(torch.arange(end), freqs).float()
    return torch.cos(angles), torch.sin(angles)


def random_model(c):
    g = torch.Generator().manual_seed(c["seed"])
    sd = {"tok_embeddings.weight": torch.randn(c["vocab_size"], c["dim"], generator=g),
          "norm.weight": 1 + 0.1 * torch.randn(c["dim"], generator=g)}
    for kind, shape in shapes(c).items():
        for i in range(c["n_layers"]):
            sd[layer_name(i, kind)] = torch.randn(*shape, generator=g) * (0.1 if len(shape) == 2 else 1)
    sd["output.weight"] = sd["tok_embeddings.weight"] if c["shared"] else torch.randn(c["vocab_size"], c["dim"],
                                                                                     generator=g)
    return sd


def f32(t):
    return t.detach().contiguous().numpy().astype("<f4").tobytes()


def write(c, out):
    sd = random_model(c)
    layers = range(c["n_layers"])
    cos, sin = precompute_freqs_cis(c["dim"] // c["n_heads"], c["max_seq_len"], c["theta"])
    vocab = c["vocab_size"] if c["shared"] else -c["vocab_size"]
    fields = [c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"]]
    with open(f"{out}/v0.bin", "wb") as f:  # legacy_export
        f.write(struct.pack("7i", *fields, vocab, c["max_seq_len"]))
        f.write(f32(sd["tok_embeddings.weight"]))
        for kind in KINDS_V0:
            for i in layers:
                f.write(f32(sd[layer_name(i, kind)]))
        f.write(f32(sd["norm.weight"]) + f32(cos) + f32(sin))
        if not c["shared"]:
            f.write(f32(sd["output.weight"]))
    with open(f"{out}/v1.bin", "wb") as f:  # version1_export
        f.write(struct.pack("I", MAGIC) + struct.pack("i", 1))
        f.write(struct.pack("7i", *fields, c["vocab_size"], c["max_seq_len"]))
        f.write(struct.pack("B", int(c["shared"])))
        f.write(b"\0" * (256 - f.tell()))
        order = [layer_name(i, "attention_norm") for i in layers] + [layer_name(i, "ffn_norm") for i in layers]
        order += ["norm.weight", "tok_embeddings.weight"]
        order += [layer_name(i, k) for k in ["wq", "wk", "wv", "wo", "w1", "w2", "w3"] for i in layers]
        if not c["shared"]:
            order.append("output.weight")
        for name in order:
            f.write(f32(sd[name]))
    sd["freq_cis_real"], sd["freq_cis_imag"] = cos, sin
    write_case(out, "expected", sd)


class Reader:
    """A float32 array read in order from an offset, as run.c's memory_map_weights advances its pointer."""

    def __init__(self, data, offset):
        self.data, self.at = data, offset

    def take(self, *shape):
        n = int(np.prod(shape))
        assert self.at + 4 * n <= len(self.data), "file ends inside a tensor"
        t = np.frombuffer(self.data, dtype="<f4", count=n, offset=self.at).reshape(shape)
        self.at += 4 * n
        return torch.from_numpy(t.copy())


def read_checkpoint(path):
    data = open(path, "rb").read()
    version = 1 if struct.unpack_from("I", data, 0)[0] == MAGIC else 0
    if version == 0:
        header = list(struct.unpack_from("7i", data, 0))
        shared = header[5] > 0
        r = Reader(data, 28)
    else:
        assert struct.unpack_from("i", data, 4)[0] == 1
        header = list(struct.unpack_from("7i", data, 8))
        shared = data[36] == 1
        r = Reader(data, 256)
    c = dict(zip(["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"], header))
    c["vocab_size"] = abs(c["vocab_size"])
    L, V, dim, hs = c["n_layers"], c["vocab_size"], c["dim"], c["dim"] // c["n_heads"]
    sh, sd = shapes(c), {}

    def kinds(names):
        for kind in names:
            stacked = r.take(L, *sh[kind])
            for i in range(L):
                sd[layer_name(i, kind)] = stacked[i]

    if version == 0:  # memory_map_weights
        sd["tok_embeddings.weight"] = r.take(V, dim)
        kinds(KINDS_V0)
        sd["norm.weight"] = r.take(dim)
        sd["freq_cis_real"] = r.take(c["max_seq_len"], hs // 2)
        sd["freq_cis_imag"] = r.take(c["max_seq_len"], hs // 2)
    else:
        kinds(["attention_norm", "ffn_norm"])
        sd["norm.weight"] = r.take(dim)
        sd["tok_embeddings.weight"] = r.take(V, dim)
        kinds(["wq", "wk", "wv", "wo", "w1", "w2", "w3"])
    sd["output.weight"] = sd["tok_embeddings.weight"] if shared else r.take(V, dim)
    assert r.at == len(data), f"{path}: {len(data)} bytes, the header implies {r.at}"
    return c, sd, header + [int(shared), version]


def read(path, out):
    c, sd, header = read_checkpoint(path)
    if "freq_cis_real" in sd:
        sd["want_freq_cis_real"], sd["want_freq_cis_imag"] = precompute_freqs_cis(
            c["dim"] // c["n_heads"], c["max_seq_len"], 10000.0)
    sd["header"] = torch.tensor(header, dtype=torch.int64)
    write_case(os.path.dirname(out) or ".", os.path.basename(out), sd)


def rmsnorm(x, w):
    return w * (x / torch.sqrt((x * x).mean() + 1e-5))


def forward(path, tokens, out):
    c, sd, _ = read_checkpoint(path)
    sd = {k: v.double() for k, v in sd.items()}
    dim, L, hs = c["dim"], c["n_layers"], c["dim"] // c["n_heads"]
    kv_mul = c["n_heads"] // c["n_kv_heads"]
    keys, values, logits = [[] for _ in range(L)], [[] for _ in range(L)], []
    i = torch.arange(0, dim, 2)
    freq = 1.0 / torch.pow(10000.0, (i % hs).double() / hs)  # run.c: head_dim = i % head_size
    for pos, token in enumerate(tokens):
        x = sd["tok_embeddings.weight"][token].clone()
        for l in range(L):
            p = f"layers.{l}."
            xb = rmsnorm(x, sd[p + "attention_norm.weight"])
            q, k, v = (sd[p + f"attention.{n}.weight"] @ xb for n in ["wq", "wk", "wv"])
            cos, sin = torch.cos(pos * freq), torch.sin(pos * freq)
            for vec in (q, k):
                n = vec.numel() // 2
                v0, v1 = vec[0::2].clone(), vec[1::2].clone()
                vec[0::2] = v0 * cos[:n] - v1 * sin[:n]
                vec[1::2] = v0 * sin[:n] + v1 * cos[:n]
            keys[l].append(k)
            values[l].append(v)
            K, Vc = torch.stack(keys[l]), torch.stack(values[l])  # (pos + 1, kv_dim)
            heads = []
            for h in range(c["n_heads"]):
                kh = K[:, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
                vh = Vc[:, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
                att = torch.softmax(kh @ q[h * hs:(h + 1) * hs] / np.sqrt(hs), dim=0)
                heads.append(att @ vh)
            x = x + sd[p + "attention.wo.weight"] @ torch.cat(heads)
            xb = rmsnorm(x, sd[p + "ffn_norm.weight"])
            h1, h3 = sd[p + "feed_forward.w1.weight"] @ xb, sd[p + "feed_forward.w3.weight"] @ xb
            x = x + sd[p + "feed_forward.w2.weight"] @ (h1 * torch.sigmoid(h1) * h3)
        logits.append(sd["output.weight"] @ rmsnorm(x, sd["norm.weight"]))
    write_case(os.path.dirname(out) or ".", os.path.basename(out), {"logits": torch.stack(logits)})


def main():
    if sys.argv[1] == "write":
        write(json.loads(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "forward":
        forward(sys.argv[2], [int(t) for t in sys.argv[3].split(",")], sys.argv[4])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
