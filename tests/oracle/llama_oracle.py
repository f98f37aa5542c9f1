# PyTorch twin of Castor's Llama for tests/nn/llama_test.cpp, written to llama2.c's model.py semantics for PyTorch
# 1.13 (model.py's non-flash path: explicit softmax(q k^T) v over k and v repeated to every query head), with the
# options of transformers' modeling_llama.py / _mistral.py / _qwen2.py (their RMSNorm cast order is model.py's).
#
#   llama_oracle.py grads|train CONFIG WEIGHTS BATCH OUT   as gpt_oracle.py (same modes, files and training recipe)
# CONFIG is a JSON object: dim, n_layers, n_heads, n_kv_heads, vocab_size, hidden_dim, norm_eps, max_seq_len,
# rope_theta, tied, and gpt_oracle.py's training and autocast keys; optional Hugging Face keys: head_dim,
# attention_bias (q, k, v, o biases), qkv_bias (q, k, v: Qwen2), mlp_bias, rope_scaling ({"rope_type": "linear" |
# "llama3", "factor", ...: tests/oracle/rope.py}), sliding_window (query i attends keys i - W + 1 .. i: Mistral).
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope  # noqa: E402
from gpt_oracle import run  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def head_dim(c):
    return c.get("head_dim") or c["dim"] // c["n_heads"]


def rotate(x, cos, sin):
    """Interleaved pairs (x0, x1), (x2, x3), ... of x (B, T, H, D) by the angles of cos, sin (T, D / 2)."""
    xr, xi = x.float().reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.d = c["n_heads"], c["n_kv_heads"], head_dim(c)
        qkv_bias = c.get("attention_bias", False) or c.get("qkv_bias", False)
        self.window = c.get("sliding_window") or 0
        self.wq = nn.Linear(c["dim"], self.h * self.d, bias=qkv_bias)
        self.wk = nn.Linear(c["dim"], self.kv * self.d, bias=qkv_bias)
        self.wv = nn.Linear(c["dim"], self.kv * self.d, bias=qkv_bias)
        self.wo = nn.Linear(self.h * self.d, c["dim"], bias=c.get("attention_bias", False))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = rotate(self.wq(x).view(b, t, self.h, self.d), cos, sin).transpose(1, 2)
        k = rotate(self.wk(x).view(b, t, self.kv, self.d), cos, sin).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv, self.d).transpose(1, 2)
        k, v = k.repeat_interleave(self.h // self.kv, dim=1), v.repeat_interleave(self.h // self.kv, dim=1)
        scores = (q @ k.transpose(2, 3)) / self.d ** 0.5
        scores = scores + torch.full((t, t), float("-inf")).triu(1)
        if self.window:  # Mistral: keys more than window - 1 positions back are masked too
            scores = scores + torch.full((t, t), float("-inf")).tril(-self.window)
        y = F.softmax(scores.float(), dim=-1).type_as(q) @ v
        return self.wo(y.transpose(1, 2).contiguous().view(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, bias):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, hidden, bias=bias), nn.Linear(hidden, dim, bias=bias), \
            nn.Linear(dim, hidden, bias=bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c["dim"], c["hidden_dim"], c.get("mlp_bias", False))
        self.attention_norm, self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"]), RMSNorm(c["dim"], c["norm_eps"])

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList([Block(c) for _ in range(c["n_layers"])])
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        self.output = nn.Linear(c["dim"], c["vocab_size"], bias=False)
        if c["tied"]:
            self.tok_embeddings.weight = self.output.weight
        freqs = rope.inv_freq(head_dim(c), c["rope_theta"], c.get("rope_scaling"))
        angles = torch.outer(torch.arange(c["max_seq_len"]).float(), freqs)
        self.cos, self.sin = torch.cos(angles), torch.sin(angles)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        h = self.tok_embeddings(idx)
        for layer in self.layers:
            h = layer(h, self.cos[:t], self.sin[:t])
        logits = self.output(self.norm(h))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


if __name__ == "__main__":
    run(Transformer)
