# PyTorch 1.13 CPU twin of attention_bench: nanoGPT's manual causal attention (PyTorch 1.13 has no
# F.scaled_dot_product_attention) forward and forward+backward, cross-entropy over GPT-2's vocabulary and layer norm,
# in float32 or under torch.autocast("cpu", torch.bfloat16). Prints "<name> <best ms>" lines.
import math
import sys
import time

import torch
import torch.nn.functional as F


def best_ms(fn, reps):
    fn()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def attention(q, k, v, bias):
    # nanoGPT's CausalSelfAttention without dropout.
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


def main():
    mode, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    bf16 = mode == "bf16"
    torch.manual_seed(0)
    for B, H, T, D in ((8, 6, 256, 64), (4, 12, 64, 64)):
        C = H * D
        # q, k, v as nanoGPT makes them: split from the (B, T, 3C) projection, viewed (B, H, T, D).
        qkv = torch.randn(B, T, 3 * C, requires_grad=True)
        bias = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        gy = torch.randn(B, H, T, D)

        def fwd():
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                q, k, v = qkv.split(C, dim=2)
                q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
                return attention(q, k, v, bias)

        def fwd_only():
            with torch.no_grad():
                fwd()

        def fwd_bwd():
            y = fwd()
            y.backward(gy.to(y.dtype))
            qkv.grad = None

        print(f"attn_fwd_{B}_{H}_{T}_{D} {best_ms(fwd_only, reps):.3f}")
        print(f"attn_fwdbwd_{B}_{H}_{T}_{D} {best_ms(fwd_bwd, reps):.3f}")
    N, V = 256, 50257
    logits = (3 * torch.randn(N, V)).to(torch.bfloat16 if bf16 else torch.float32).requires_grad_()
    target = torch.randint(0, V, (N,))

    def ce():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(logits, target)
        loss.backward()
        logits.grad = None

    print(f"ce_fwdbwd_{N}_{V} {best_ms(ce, reps):.3f}")

    # Layer norm of (2048, 768) activations; bfloat16 activations and parameters for bf16 (autocast leaves layer_norm
    # in the dtype it gets, and PyTorch 1.13 takes no float32 parameters with bfloat16 input).
    R, C = 2048, 768
    dt = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(R, C).to(dt).requires_grad_()
    ln = torch.nn.LayerNorm(C).to(dt)
    gy = torch.randn(R, C).to(dt)

    def layer_norm():
        y = ln(x)
        y.backward(gy)
        x.grad = None
        ln.zero_grad()

    print(f"ln_fwdbwd_{R}_{C} {best_ms(layer_norm, reps):.3f}")


main()
