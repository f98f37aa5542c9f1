# PyTorch 1.13 twin of `castor train --model gpt` (the default job): nanoGPT's CPU recipe on a token directory -
# 4 layers, 4 heads, 128 wide, block 64, batch 12, AdamW lr 1e-3 with 100 warmup steps and a cosine to 1e-4 at the
# last step, weight decay 0.1 on 2-D tensors, betas (0.9, 0.99), clip 1.0, dropout 0, random windows - then the loss
# over the whole validation split in consecutive windows of 64 (as Castor evaluates).
#   nanogpt_job_torch.py DIR O0|O1 STEPS  -> "torch job LEVEL TRAIN_SECONDS VAL_LOSS"
# Run it as bench/default_job_vs_torch.sh does: /usr/bin/python3, tcmalloc preloaded, OMP_WAIT_POLICY=passive for O0.
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import gpt_oracle  # noqa: E402


def tokens(path):  # llm.c's token file: 256 int32 header, then uint16 tokens
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520, path
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64))


def main():
    directory, level, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(2)
    torch.manual_seed(1337)
    train, val = tokens(os.path.join(directory, "train.bin")), tokens(os.path.join(directory, "val.bin"))
    vocab = int(max(train.max(), val.max())) + 1
    cfg = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=vocab, bias=True)
    b, t, lr, min_lr, warmup = 12, 64, 1e-3, 1e-4, 100
    model = gpt_oracle.GPT(cfg).train()
    with torch.no_grad():  # nanoGPT's _init_weights: N(0, 0.02), residual projections 0.02/sqrt(2L), zero biases
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99))
    autocast = level == "O1"
    start = time.perf_counter()
    for it in range(steps):
        if it < warmup:
            now = lr * (it + 1) / (warmup + 1)
        else:
            ratio = (it - warmup) / max(steps - warmup, 1)
            now = min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
        for g in opt.param_groups:
            g["lr"] = now
        ix = torch.randint(len(train) - t, (b,))
        x = torch.stack([train[i:i + t] for i in ix])
        y = torch.stack([train[i + 1:i + 1 + t] for i in ix])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - start
    model.eval()
    rows = (len(val) - 1) // t
    total, count = 0.0, 0
    with torch.no_grad():
        for r0 in range(0, rows, 64):
            idx = torch.arange(r0, min(r0 + 64, rows))
            x = torch.stack([val[i * t:i * t + t] for i in idx])
            y = torch.stack([val[i * t + 1:i * t + 1 + t] for i in idx])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits, _ = model(x, y)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            count += y.numel()
    print(f"torch job {level} {seconds:.2f} {total / count:.4f}")


if __name__ == "__main__":
    main()
