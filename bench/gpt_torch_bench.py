# PyTorch 1.13 twin of bench/gpt_bench.cpp: nanoGPT's model (tests/oracle/gpt_oracle.py) - one block's forward+backward
# and AdamW training steps - at fp32 (O0) or under torch.autocast("cpu", torch.bfloat16) (O1). Run it as
# bench/gpt_vs_torch.sh does: /usr/bin/python3, tcmalloc preloaded, OMP_WAIT_POLICY=passive for O0 only.
#
#   gpt_torch_bench.py block char|124m|124m-8x256 O0|O1 ITERS          -> "torch block CONFIG LEVEL MS" (best of ITERS)
#   gpt_torch_bench.py step char|124m|124m-8x256 O0|O1 WARMUP ITERS    -> "torch step CONFIG LEVEL TOKENS_PER_S"
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import gpt_oracle  # noqa: E402
import lm_torch_step  # noqa: E402  (bench/, this file's directory)

CONFIGS = {  # (model config, B, T), as gpt_bench.cpp's
    "char": (dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=85, bias=True), 8, 256),
    "124m": (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, bias=True), 4, 64),
    "124m-8x256": (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, bias=True), 8, 256),
}


def step_bench(name, level, warmup, iters):
    cfg, b, t = CONFIGS[name]
    torch.manual_seed(1)
    model = gpt_oracle.GPT(cfg).train()
    opt = lm_torch_step.adamw(model, lr=6e-4)
    x = torch.randint(0, cfg["vocab_size"], (b, t))
    y = torch.randint(0, cfg["vocab_size"], (b, t))
    rate = lm_torch_step.tokens_per_second(model, opt, x, y, level, warmup, iters)
    print(f"torch step {name} {level} {rate:.1f}", flush=True)


def block_bench(name, level, iters):
    cfg, b, t = CONFIGS[name]
    torch.manual_seed(1)
    block = gpt_oracle.Block(cfg).train()
    x = torch.randn(b, t, cfg["n_embd"], requires_grad=True)
    dy = torch.randn(b, t, cfg["n_embd"])

    def once():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=level == "O1"):
            out = block(x)
        out.backward(dy.to(out.dtype))
        block.zero_grad(set_to_none=True)
        x.grad = None

    once()
    best = 1e30
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    print(f"torch block {name} {level} {1e3 * best:.3f}", flush=True)


def main():
    torch.set_num_threads(2)
    kind, name, level = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "block":
        block_bench(name, level, int(sys.argv[4]))
    else:
        step_bench(name, level, int(sys.argv[4]), int(sys.argv[5]))


if __name__ == "__main__":
    main()
