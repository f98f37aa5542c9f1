# Hugging Face's Llama, Mistral and Qwen2 as transformers' modeling_llama.py / _mistral.py / _qwen2.py compute them
# (rotate_half pairs (i, i + d/2), RMSNorm's cast before the weight, repeat_kv, linear and llama3 rope scaling,
# head_dim, Llama's attention_bias / mlp_bias, Qwen2's q/k/v biases, Mistral's and Qwen2's sliding windows), on
# PyTorch 1.13, for tests/formats/hf_test.cpp. Directories are read and written with safetensors_io.py, shards and
# index included.
#
#   hf_llama_oracle.py write DIR CONFIG   a random model (seed CONFIG["seed"]) as a Hugging Face directory:
#       config.json (CONFIG's keys but "seed", "shards", "v5"), model.safetensors, or CONFIG["shards"] files and
#       model.safetensors.index.json; "v5": transformers v5's rope_parameters and dtype spellings
#   hf_llama_oracle.py logits DIR BATCH OUT   float32 logits of BATCH's "x" (B, T) -> OUT "logits"
#   hf_llama_oracle.py logits16 DIR BATCH OUT   the same with the model in its torch_dtype (from_pretrained's
#       torch_dtype=...: weights and activations 16-bit) -> OUT "logits" (float32 copy)
#   hf_llama_oracle.py rmsnorm BATCH OUT   LlamaRMSNorm (eps 1e-6) of BATCH's "x" with weight "w" (any dtypes) -> "y"
#   hf_llama_oracle.py train DIR BATCH OUT    AdamW (lr 1e-3, wd 0.1 on dim >= 2, betas 0.9/0.99, clip 1.0) for
#       BATCH's "x.<i>", "y.<i>" cycled over 10 steps -> OUT "loss" (float32 [10])
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read, write  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rope_inv_freq(c, d):
    """modeling_rope_utils: default and llama3 (_compute_llama3_parameters) inverse frequencies."""
    p = c.get("rope_parameters") or c.get("rope_scaling") or {}
    theta = p.get("rope_theta", c.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "linear":
        return inv / p["factor"]
    if kind != "llama3":
        return inv
    factor, low, high, orig = p["factor"], p["low_freq_factor"], p["high_freq_factor"], \
        p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < orig / high) * ~(wavelen > orig / low)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, weight, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def windows(c):
    """Each layer's sliding window (None: full causal attention) as configuration_mistral/_qwen2 set them."""
    n, arch = c["num_hidden_layers"], c["architectures"][0]
    if arch == "MistralForCausalLM":
        return [c.get("sliding_window", 4096)] * n
    if arch != "Qwen2ForCausalLM":
        return [None] * n
    w = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
    types = c.get("layer_types") or ["sliding_attention" if w is not None and i >= c.get("max_window_layers", 28)
                                     else "full_attention" for i in range(n)]
    return [c.get("sliding_window", 4096) if t == "sliding_attention" else None for t in types]


class Layer(nn.Module):
    def __init__(self, c, window):
        super().__init__()
        h, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d, self.window = c.get("head_dim") or h // self.nh, window
        llama = c["architectures"][0] == "LlamaForCausalLM"  # (Mistral and Qwen2 do not read the bias keys)
        o_bias, mlp_bias = llama and c.get("attention_bias", False), llama and c.get("mlp_bias", False)
        qkv_bias = c["architectures"][0] == "Qwen2ForCausalLM" or o_bias
        self.self_attn = nn.Module()
        a = self.self_attn
        a.q_proj = nn.Linear(h, self.nh * self.d, bias=qkv_bias)
        a.k_proj = nn.Linear(h, self.nkv * self.d, bias=qkv_bias)
        a.v_proj = nn.Linear(h, self.nkv * self.d, bias=qkv_bias)
        a.o_proj = nn.Linear(self.nh * self.d, h, bias=o_bias)
        self.mlp = nn.Module()
        ff, mb = c["intermediate_size"], mlp_bias
        self.mlp.gate_proj, self.mlp.up_proj = nn.Linear(h, ff, bias=mb), nn.Linear(h, ff, bias=mb)
        self.mlp.down_proj = nn.Linear(ff, h, bias=mb)
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        a = self.self_attn
        y = self.input_layernorm(x)
        q = a.q_proj(y).view(b, t, self.nh, self.d).transpose(1, 2)
        k = a.k_proj(y).view(b, t, self.nkv, self.d).transpose(1, 2)
        v = a.v_proj(y).view(b, t, self.nkv, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.nh // self.nkv, dim=1), v.repeat_interleave(self.nh // self.nkv, dim=1)
        i = torch.arange(t)
        allowed = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] < self.window) if self.window else True)
        mask = torch.zeros(t, t).masked_fill(~allowed, float("-inf")).to(q.dtype)
        s = q @ k.transpose(2, 3) / math.sqrt(self.d) + mask
        o = (F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + a.o_proj(o)
        m = self.mlp
        y = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(y)) * m.up_proj(y))


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList(Layer(c, w) for w in windows(c))
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = rope_inv_freq(c, self.model.layers[0].d)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        freqs = torch.arange(t).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def config_of(d):
    with open(f"{d}/config.json") as f:
        c = json.load(f)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    return c


def load(d):
    c = config_of(d)
    model = CausalLM(c)
    state = {}
    if os.path.exists(f"{d}/model.safetensors.index.json"):
        with open(f"{d}/model.safetensors.index.json") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        state.update(read(f"{d}/{name}")[0])
    if c.get("tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model


def write_dir(d, cfg):
    cfg = dict(cfg)
    seed, shards, v5 = cfg.pop("seed", 0), cfg.pop("shards", 1), cfg.pop("v5", False)
    torch.manual_seed(seed)
    model = CausalLM(dict(cfg, num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"])))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p) if "bias" in name
                    else torch.randn_like(p) / math.sqrt(p.shape[-1]))
    dtype = DTYPES[cfg.get("torch_dtype", "float32")]
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings", False):
        del state["lm_head.weight"]
    if v5:
        cfg["dtype"] = cfg.pop("torch_dtype", "float32")
        cfg["rope_parameters"] = dict(cfg.pop("rope_scaling", None) or {"rope_type": "default"},
                                      rope_theta=cfg.pop("rope_theta", 10000.0))
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(state)
    if shards == 1:
        write(f"{d}/model.safetensors", state, {"format": "pt"})
        return
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[s * per:(s + 1) * per]}
        write(f"{d}/{file}", part, {"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(f"{d}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def main():
    torch.set_num_threads(2)
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "write":
        write_dir(d, json.loads(sys.argv[3]))
        return
    if mode == "rmsnorm":
        batch = read(d)[0]
        write(sys.argv[3], {"y": rms_norm(batch["x"], batch["w"], 1e-6).contiguous()}, {})
        return
    model, batch, out = load(d), read(sys.argv[3])[0], sys.argv[4]
    if mode in ("logits", "logits16"):
        if mode == "logits16":
            model.to(DTYPES[model.c.get("dtype", model.c.get("torch_dtype", "float32"))])
        with torch.no_grad():
            write(out, {"logits": model(batch["x"])[0].float().contiguous()}, {})
        return
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    n, losses = len([k for k in batch if k.startswith("x.")]), []
    for step in range(10):
        _, loss = model(batch[f"x.{step % n}"], batch[f"y.{step % n}"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
    write(out, {"loss": torch.tensor(losses, dtype=torch.float32)}, {})


if __name__ == "__main__":
    main()
