# PyTorch 1.13 side of bench/eval_vs_torch.sh (issue #47's scoring throughput): the rows bench/eval_bench.cpp wrote
# (IDS: a context and 4 continuations of token ids each) scored as lm-evaluation-harness's Hugging Face backend does
# (each choice's context + continuation a row, the row's 4 choices one right-padded batch, log_softmax, the
# continuation's log-probabilities summed), with Hugging Face's Llama math (tests/oracle/hf_llama_oracle.py) held in
# bfloat16 under torch.autocast("cpu", torch.bfloat16), torch.inference_mode(). Run as the script does:
# /usr/bin/python3, tcmalloc preloaded, torch.set_num_threads(THREADS).
#
#   eval_torch_bench.py DIR IDS [THREADS=2]   -> "torch rows/s R tok/s T" (tokens counted as eval_bench counts them)
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import hf_llama_oracle  # noqa: E402


def score(model, row):
    ctx, conts = row["context"], row["continuations"]
    width = len(ctx) + max(len(c) for c in conts) - 1
    batch = torch.zeros((len(conts), width), dtype=torch.long)
    for i, c in enumerate(conts):
        seq = (ctx + c)[:-1]
        batch[i, : len(seq)] = torch.tensor(seq)
    logits, _ = model(batch)
    logp = F.log_softmax(logits.float(), dim=-1)
    out = []
    for i, c in enumerate(conts):
        pos = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(c))
        out.append(float(logp[i, pos, torch.tensor(c)].sum()))
    return out


def main():
    d, ids = sys.argv[1], sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    model = hf_llama_oracle.load(d).to(torch.bfloat16).eval()
    with open(ids) as f:
        case = json.load(f)
    rows, warmup = case["rows"], case["warmup"]
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        for row in rows[:warmup]:
            score(model, row)
        tokens, t0 = 0, time.perf_counter()
        for row in rows[warmup:]:
            score(model, row)
            tokens += len(row["context"]) + sum(len(c) for c in row["continuations"])
        s = time.perf_counter() - t0
    n = len(rows) - warmup
    print(f"torch rows/s {n / s:.3f} tok/s {tokens / s:.1f}")


if __name__ == "__main__":
    main()
