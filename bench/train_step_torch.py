# PyTorch 1.13 twin of bench/train_step_bench.cpp: training steps (forward, cross_entropy, backward, Adam) per second.
#
#   train_step_torch.py MODEL BATCH WARMUP ITERS SECONDS THREADS MODE...
#       MODEL simplecnn | resnet18 (the models of tests/oracle/models_oracle.py, input 3x32x32, 10 classes);
#       MODE fp32 (float32) | bf16 (torch.autocast("cpu", torch.bfloat16) around forward and loss), each optionally
#       suffixed "_cl" for channels_last model and input. Times ITERS steps after WARMUP, stopping early (after at least
#       2) once SECONDS have passed. Prints one line per MODE: "MODE IMAGES_PER_SECOND".
# Run with /usr/bin/python3 (Debian's torch with OpenBLAS), not a venv python.
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import models_oracle  # noqa: E402


def images_per_second(name, batch, warmup, iters, seconds, mode):
    torch.manual_seed(0)
    model = models_oracle.build(name, 3, 32, 32, 10).train()
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    if mode.endswith("_cl"):
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    autocast = mode.startswith("bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    done = 0
    while done < iters and (done < 2 or time.perf_counter() - t0 < seconds):
        step()
        done += 1
    return batch * done / (time.perf_counter() - t0)


def main():
    name, batch, warmup, iters, seconds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(
        sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(threads)
    for mode in sys.argv[7:]:
        print(mode, f"{images_per_second(name, batch, warmup, iters, seconds, mode):.1f}", flush=True)


if __name__ == "__main__":
    main()
