# PyTorch 1.13 side of bench/lora_vs_torch.sh (issue #38, Memory and speed): writes the TinyLlama-1.1B-shaped Hugging
# Face directory both sides train (random bfloat16 weights, N(0, 0.02), norms 1), and times LoRA training of it as a
# PyTorch user would write it: Hugging Face's Llama math (tests/oracle/hf_llama_oracle.py), the base frozen in bfloat16
# (norms float32), a hand-written LoRA (x A^T B^T alpha / r, A kaiming-uniform, B zeros, as PEFT) on every linear layer
# but lm_head, torch.autocast("cpu", torch.bfloat16), AdamW (lr 1e-4) on the adapters. Run it as the script does:
# /usr/bin/python3, tcmalloc preloaded, torch.set_num_threads(THREADS).
#
#   lora_torch.py write DIR LAYERS            the directory (config.json, model.safetensors written tensor by tensor)
#   lora_torch.py train DIR TOKENS WARMUP ITERS THREADS [RANK=16] [ALPHA=32]
#       -> "torch lora tokens/s RATE peak_rss_gib RSS": ITERS timed steps of one 512-token row of llm.c token file
#          TOKENS' first tokens, after WARMUP untimed ones
import json
import math
import os
import resource
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import hf_llama_oracle  # noqa: E402


def config(layers):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 5632, "num_hidden_layers": layers, "num_attention_heads": 32,
            "num_key_value_heads": 4, "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}


def shapes(c):
    h, ff, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"] * 64
    out = [("model.embed_tokens.weight", [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [h]), (p + "self_attn.q_proj.weight", [h, h]),
                (p + "self_attn.k_proj.weight", [kv, h]), (p + "self_attn.v_proj.weight", [kv, h]),
                (p + "self_attn.o_proj.weight", [h, h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "mlp.gate_proj.weight", [ff, h]), (p + "mlp.up_proj.weight", [ff, h]),
                (p + "mlp.down_proj.weight", [h, ff])]
    return out + [("model.norm.weight", [h]), ("lm_head.weight", [c["vocab_size"], h])]


def write_dir(d, layers):
    c = config(layers)
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/config.json", "w") as f:
        json.dump(c, f, indent=2)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes(c):
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode("utf-8")
    gen = torch.Generator().manual_seed(0)
    with open(f"{d}/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes(c):
            t = torch.ones(shape) if "norm" in name else torch.randn(shape, generator=gen) * 0.02
            f.write(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes())


class LoraLinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


def lora_model(d, rank, alpha):
    c = hf_llama_oracle.config_of(d)
    model = hf_llama_oracle.CausalLM(c)
    with open(f"{d}/model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        header.pop("__metadata__", None)
        with torch.no_grad():
            for name, p in model.named_parameters():  # the base in bfloat16, norms in float32, one tensor at a time
                begin, end = header[name]["data_offsets"]
                f.seek(8 + n + begin)
                t = torch.frombuffer(bytearray(f.read(end - begin)), dtype=torch.bfloat16).reshape(p.shape)
                p.data = t.float() if "norm" in name else t
                p.requires_grad_(False)
    for layer in model.model.layers:
        for holder, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                setattr(holder, n, LoraLinear(getattr(holder, n), rank, alpha))
    return model


def train(d, tokens, warmup, iters, threads, rank=16, alpha=32):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = lora_model(d, rank, alpha).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    with open(tokens, "rb") as f:
        f.seek(1024)
        ids = struct.unpack("<513H", f.read(2 * 513))
    row = torch.tensor(ids, dtype=torch.int64)
    x, y = row[:-1].unsqueeze(0), row[1:].unsqueeze(0)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    rate = x.numel() * iters / (time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"torch lora tokens/s {rate:.1f} peak_rss_gib {rss:.2f}", flush=True)


def main():
    if sys.argv[1] == "write":
        write_dir(sys.argv[2], int(sys.argv[3]))
    else:
        train(sys.argv[2], sys.argv[3], *[int(a) for a in sys.argv[4:]])


if __name__ == "__main__":
    main()
