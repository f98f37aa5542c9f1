# The language-model training step the PyTorch twins share (bench/gpt_torch_bench.py, bench/llama_torch.py,
# bench/nanogpt_job_torch.py): AdamW with nanoGPT's and train.py's decay groups, and one step on a batch in float32
# or under torch.autocast("cpu", torch.bfloat16), optionally clipping the gradient norm.
import time

import torch


def adamw(model, lr, betas=(0.9, 0.95)):
    """AdamW with weight decay 0.1 on the tensors of 2 or more dims and none on the rest."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def train_step(model, opt, x, y, bf16, clip=None):
    """One step of `model(x, y) -> (logits, loss)`: under bf16 autocast when `bf16`; the norm clipped to `clip`."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()


def tokens_per_second(model, opt, x, y, level, warmup, iters, clip=None):
    """Steps on the batch (x, y) at `level` (O0: float32, O1: bf16 autocast): `warmup` first, then `iters` timed."""
    for _ in range(warmup):
        train_step(model, opt, x, y, level == "O1", clip)
    t0 = time.perf_counter()
    for _ in range(iters):
        train_step(model, opt, x, y, level == "O1", clip)
    return x.numel() * iters / (time.perf_counter() - t0)
