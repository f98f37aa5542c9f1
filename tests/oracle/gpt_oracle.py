# PyTorch twin of Castor's GPT (nanoGPT's model, written for PyTorch 1.13: attention as explicit softmax(q k^T) v)
# for tests/nn/gpt_test.cpp.
#
#   gpt_oracle.py grads CONFIG WEIGHTS BATCH OUT
#       loads WEIGHTS (safetensors with nanoGPT names) strictly, runs BATCH's "x", "y" (int64 (B, T)) forward and
#       backward and writes OUT: "loss" (float32 [1]), "logits", "grad.<name>" for every named parameter.
#   gpt_oracle.py train CONFIG WEIGHTS BATCH OUT
#       AdamW (nanoGPT's configure_optimizers groups: decay on dim >= 2) for CONFIG["steps"] steps on BATCH's
#       "x.<i>", "y.<i>" (cycled), clip 1.0; writes OUT "loss" (float32 [steps]).
# CONFIG is a JSON object: n_layer, n_head, n_embd, block_size, vocab_size, bias, and for train lr, weight_decay,
# beta1, beta2, steps; "autocast": "bf16" runs forward and loss under torch.autocast("cpu", torch.bfloat16).
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read, write  # noqa: E402


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        t = c["block_size"]
        self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, e = x.shape
        q, k, v = self.c_attn(x).split(e, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, e // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, e))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], elementwise_affine=True)
        self.attn = SelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], elementwise_affine=True)
        self.mlp = Mlp(c)
        if not c["bias"]:
            self.ln_1.bias = None
            self.ln_2.bias = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"])))
        if not c["bias"]:
            self.transformer.ln_f.bias = None
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def run(make_model):
    """The command line above for the model make_model(CONFIG) builds (forward(idx, targets) -> (logits, loss))."""
    mode, cfg, weights, batch, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    torch.set_num_threads(2)
    model = make_model(cfg)
    state, _, _, _ = read(weights)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    tensors, _, _, _ = read(batch)
    autocast = cfg.get("autocast") == "bf16"

    def loss_of(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(x, y)

    if mode == "grads":
        logits, loss = loss_of(tensors["x"], tensors["y"])
        loss.backward()
        result = {"loss": loss.detach().float().reshape(1), "logits": logits.detach().float().contiguous()}
        for name, p in model.named_parameters():
            result["grad." + name] = p.grad.float().contiguous()
        write(out, result, {})
        return
    params = [p for p in model.parameters()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]))
    n = len([k for k in tensors if k.startswith("x.")])
    losses = []
    for step in range(cfg["steps"]):
        _, loss = loss_of(tensors[f"x.{step % n}"], tensors[f"y.{step % n}"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    write(out, {"loss": torch.tensor(losses, dtype=torch.float32)}, {})


if __name__ == "__main__":
    run(GPT)
