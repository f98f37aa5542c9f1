# PyTorch oracle for tests/nn/transformer_ops_test.cpp: the transformer ops forward and backward in float32, float16
# and bfloat16, written to one safetensors file (argv[1]): "<case>.in<i>", "<case>.out", "<case>.gout",
# "<case>.grad<i>" (floating inputs), and metadata "cases": "name op dtype;...".
# Reference policy: float32 cases are PyTorch's own ops and autograd. 16-bit cases are computed in float32 from the
# 16-bit inputs (and 16-bit parameters) and each result rounded once to the 16-bit type, the contract Castor's
# kernels follow (rms_norm also rounds its normalised input first, as torch.nn.RMSNorm does) (PyTorch 1.13 has no float16 CPU kernels for most of these, and no rms_norm or
# scaled_dot_product_attention at all: those are written out as nanoGPT / torch.nn.RMSNorm define them).
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write  # noqa: E402

torch.manual_seed(0)
IGNORE = -100


DTYPE = torch.float32  # the case's dtype (main sets it)


def rms_norm(x, w, eps=1e-6):
    # torch.nn.RMSNorm's (and Hugging Face's LlamaRMSNorm's) cast order: the normalised input rounded to the input's
    # dtype, then the product with the weight rounded (below, as every 16-bit case's result).
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(DTYPE).float()
    return y * w if w is not None else y


def attention(q, k, v, mask, causal):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal:
        t, u = q.size(-2), k.size(-2)
        s = s.masked_fill(torch.ones(t, u, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return torch.softmax(s, -1) @ v


def gqa_attention(q, k, v, mask, causal):
    # Grouped-query attention as llama2.c's model.py runs it: each k/v head repeated for the query heads sharing it
    # (repeat_kv, i.e. repeat_interleave on the head dim), then plain attention.
    rep = q.size(1) // k.size(1)
    return attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), mask, causal)


def qkv_attention(x, n_head):
    # nanoGPT's CausalSelfAttention between c_attn and c_proj.
    b, t, c = x.size(0), x.size(1), x.size(2) // 3
    heads = lambda z: z.reshape(b, t, n_head, c // n_head).transpose(1, 2)
    q, k, v = (heads(z) for z in x.split(c, dim=2))
    return attention(q, k, v, None, True).transpose(1, 2).reshape(b, t, c)


def targets(n, v):
    t = torch.randint(0, v, (n,))
    t[1] = IGNORE
    return t


# name: (function of the inputs, input makers); floating inputs get gradients.
CASES = {
    "layer_norm": (lambda x: F.layer_norm(x[0], (24,), x[1], x[2]),
                   [lambda: torch.randn(3, 5, 24) * 2 + 1, lambda: torch.randn(24), lambda: torch.randn(24)]),
    "layer_norm_plain": (lambda x: F.layer_norm(x[0], (4, 6)), [lambda: torch.randn(7, 4, 6)]),
    "rms_norm": (lambda x: rms_norm(x[0], x[1]), [lambda: torch.randn(6, 40), lambda: torch.randn(40)]),
    "embedding": (lambda x: F.embedding(x[0], x[1], padding_idx=2),
                  [lambda: torch.tensor([[0, 2, 5], [5, 1, 2]]), lambda: torch.randn(9, 16)]),
    "attention_causal": (lambda x: attention(x[0], x[1], x[2], None, True),
                         [lambda: torch.randn(2, 3, 20, 16), lambda: torch.randn(2, 3, 20, 16),
                          lambda: torch.randn(2, 3, 20, 16)]),
    "attention_mask": (lambda x: attention(x[0], x[1], x[2], x[3], False),
                       [lambda: torch.randn(1, 2, 9, 32), lambda: torch.randn(1, 2, 13, 32),
                        lambda: torch.randn(1, 2, 13, 32), lambda: torch.rand(1, 1, 9, 13) > 0.3]),
    "attention_gqa": (lambda x: gqa_attention(x[0], x[1], x[2], None, True),
                      [lambda: torch.randn(2, 6, 70, 16), lambda: torch.randn(2, 2, 70, 16),
                       lambda: torch.randn(2, 2, 70, 16)]),
    "attention_mqa_mask": (lambda x: gqa_attention(x[0], x[1], x[2], x[3], False),
                           [lambda: torch.randn(1, 4, 9, 32), lambda: torch.randn(1, 1, 13, 32),
                            lambda: torch.randn(1, 1, 13, 32), lambda: torch.rand(1, 1, 9, 13) > 0.3]),
    "attention_qkv": (lambda x: qkv_attention(x[0], 3), [lambda: torch.randn(2, 20, 3 * 48)]),
    "cross_entropy": (lambda x: F.cross_entropy(x[0], x[1], ignore_index=IGNORE, reduction="none"),
                      [lambda: torch.randn(8, 300) * 3, lambda: targets(8, 300)]),
    "cross_entropy_smooth": (lambda x: F.cross_entropy(x[0], x[1], label_smoothing=0.1, reduction="sum"),
                             [lambda: torch.randn(8, 300) * 3, lambda: torch.randint(0, 300, (8,))]),
}


def main():
    global DTYPE
    out, names = {}, []
    for dname, d in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        DTYPE = d
        for op, (fn, makers) in CASES.items():
            inputs = [m() for m in makers]
            inputs = [t.to(d) if t.is_floating_point() else t for t in inputs]
            leaves = [t.float().requires_grad_() if t.is_floating_point() else t for t in inputs]
            y = fn(leaves)
            gout = torch.randn(y.shape).to(d if op != "cross_entropy" and op != "cross_entropy_smooth"
                                            else torch.float32)
            grads = torch.autograd.grad(y, [t for t in leaves if t.is_floating_point()], gout.float())
            name = f"{op}.{dname}"
            names.append(f"{name} {op} {dname}")
            for i, t in enumerate(inputs):
                out[f"{name}.in{i}"] = t
            out_dtype = torch.float32 if op.startswith("cross_entropy") else d
            out[f"{name}.out"] = y.detach().to(out_dtype)
            out[f"{name}.gout"] = gout
            floating = [t for t in inputs if t.is_floating_point()]
            for i, (g, t) in enumerate(zip(grads, floating)):
                out[f"{name}.grad{i}"] = g.to(t.dtype)
    write(sys.argv[1], out, {"cases": ";".join(names)})


if __name__ == "__main__":
    main()
