# PyTorch 1.13 twin of bench/llama_bench.cpp (issue #28, Performance): AdamW training steps of llama2.c's model.py
# Llama (tests/oracle/llama_oracle.py: its RMSNorm, interleaved rotary embeddings, grouped-query attention by repeated
# k/v heads, SwiGLU, tied output; PyTorch 1.13 has no F.scaled_dot_product_attention, so model.py's explicit
# softmax(q k^T) v path) at the llama-15m shape, float32 (O0) or under torch.autocast("cpu", torch.bfloat16) (O1),
# with train.py's optimizer (AdamW lr 5e-4, betas 0.9/0.95, weight decay 0.1 on tensors of 2 or more dims) and
# gradient clipping at 1.0. Steady state: WARMUP steps first, then ITERS timed steps. Run it as
# bench/llama_vs_torch.sh does: /usr/bin/python3, tcmalloc preloaded, OMP_WAIT_POLICY=passive for O0.
#
#   llama_torch.py O0|O1 [N_KV_HEADS=6] [BATCH=8] [WARMUP=2] [ITERS=5]  -> "torch step llama-15m LEVEL KV TOKENS_PER_S"
# The shape: dim 288, 6 layers, 6 heads, context 256, vocabulary 512 (the default), hidden 768 (model.py's
# rule with multiple_of 32); batch 8 x 256 tokens (train.py's 128 x 256 x 4 accumulation scaled down for 2 cores).
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import llama_oracle  # noqa: E402
import lm_torch_step  # noqa: E402  (bench/, this file's directory)


def config(n_kv_heads, dim=288, n_layers=6, n_heads=6, max_seq_len=256):
    """model.py's ModelArgs (multiple_of 32, vocabulary 512, tied); the defaults are llama-15m's sizes."""
    multiple_of = 32
    hidden = int(2 * 4 * dim / 3)
    hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    return dict(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=512, hidden_dim=hidden,
                norm_eps=1e-5, max_seq_len=max_seq_len, rope_theta=10000.0, tied=True)


def init_like_model_py(model, n_layers):
    """model.py's _init_weights: N(0, 0.02) for Linear and Embedding weights, N(0, 0.02 / sqrt(2 L)) for w3, wo."""
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("w3.weight", "wo.weight")) else 0.02
        torch.nn.init.normal_(p, mean=0.0, std=std)


def main():
    torch.set_num_threads(2)
    level = sys.argv[1]
    defaults = [6, 8, 2, 5]
    n_kv, batch, warmup, iters = [int(a) for a in sys.argv[2:6]] + defaults[len(sys.argv[2:6]):]
    if level not in ("O0", "O1"):
        sys.exit("llama_torch.py: LEVEL must be O0 or O1")
    cfg = config(n_kv)
    torch.manual_seed(1337)
    model = llama_oracle.Transformer(cfg).train()
    init_like_model_py(model, cfg["n_layers"])
    opt = lm_torch_step.adamw(model, lr=5e-4)
    t = cfg["max_seq_len"]
    x = torch.randint(0, cfg["vocab_size"], (batch, t))
    y = torch.randint(0, cfg["vocab_size"], (batch, t))
    rate = lm_torch_step.tokens_per_second(model, opt, x, y, level, warmup, iters, clip=1.0)
    print(f"torch step llama-15m {level} {n_kv} {rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
