# PyTorch 1.13 twin of the default language-model jobs, `castor train --model gpt` and `--model llama`: nanoGPT's
# CPU recipe on a token directory - AdamW with a linear warmup and a cosine to a tenth of the peak at the last step,
# weight decay 0.1 on 2-D tensors, betas (0.9, 0.99), clip 1.0, dropout 0, batch 12 random windows - then the loss
# over the validation rows Castor evaluates (--eval-iters 200 batches of 12 rows of the block size, spread evenly over
# the split: row k of m of all n is k n / m; the whole split when it holds fewer).
#   gpt:   4 layers, 4 heads, 128 wide, block 64, lr 1e-3, 100 warmup steps (nanoGPT's GPT, tests/oracle/gpt_oracle.py)
#   llama: dim 128, 4 layers, 8 heads over 4 kv heads, context 128, lr 2e-3, 50 warmup steps (llama2.c's model.py,
#          tests/oracle/llama_oracle.py, built and initialised as bench/llama_torch.py does)
#   nanogpt_job_torch.py DIR O0|O1 STEPS [gpt|llama]  -> "torch job LEVEL TRAIN_SECONDS VAL_LOSS"
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
import llama_oracle  # noqa: E402
import llama_torch  # noqa: E402  (bench/, this file's directory)
import lm_torch_step  # noqa: E402


def tokens(path):  # llm.c's token file: 256 int32 header, then uint16 tokens
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520, path
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64))


def gpt(vocab):
    """nanoGPT's GPT at the default job's sizes, with its _init_weights; (model, block size, lr, warmup steps)."""
    cfg = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=vocab, bias=True)
    model = gpt_oracle.GPT(cfg)
    with torch.no_grad():  # N(0, 0.02), residual projections 0.02/sqrt(2L), zero biases
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std)
    return model, 64, 1e-3, 100


def llama(vocab):
    """llama2.c's Transformer at the `llama` preset's sizes, with model.py's init; (model, block size, lr, warmup)."""
    cfg = llama_torch.config(4, dim=128, n_layers=4, n_heads=8, max_seq_len=128)
    assert vocab <= cfg["vocab_size"], f"llama: {vocab} token ids, more than the {cfg['vocab_size']}-piece vocabulary"
    model = llama_oracle.Transformer(cfg)
    llama_torch.init_like_model_py(model, cfg["n_layers"])
    return model, 128, 2e-3, 50


def main():
    directory, level, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kind = sys.argv[4] if len(sys.argv) > 4 else "gpt"
    if kind not in ("gpt", "llama"):
        sys.exit(f"nanogpt_job_torch.py: model {kind}: expected gpt or llama")
    torch.set_num_threads(2)
    torch.manual_seed(1337)
    train, val = tokens(os.path.join(directory, "train.bin")), tokens(os.path.join(directory, "val.bin"))
    vocab = int(max(train.max(), val.max())) + 1
    model, t, lr, warmup = (gpt if kind == "gpt" else llama)(vocab)
    model.train()
    b, min_lr, eval_iters = 12, lr / 10, 200
    opt = lm_torch_step.adamw(model, lr, betas=(0.9, 0.99))
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
        lm_torch_step.train_step(model, opt, x, y, autocast, clip=1.0)
    seconds = time.perf_counter() - start
    model.eval()
    rows = (len(val) - 1) // t
    m = min(rows, eval_iters * b)
    picked = [k * rows // m for k in range(m)]
    total, count = 0.0, 0
    with torch.no_grad():
        for r0 in range(0, m, 64):
            idx = picked[r0:r0 + 64]
            x = torch.stack([val[i * t:i * t + t] for i in idx])
            y = torch.stack([val[i * t + 1:i * t + 1 + t] for i in idx])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits, _ = model(x, y)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            count += y.numel()
    print(f"torch job {level} {seconds:.2f} {total / count:.4f}")


if __name__ == "__main__":
    main()
