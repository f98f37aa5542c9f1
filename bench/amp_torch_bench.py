# PyTorch 1.13 CPU twin of amp_bench: SimpleCNN training steps at batch 256, float32 and autocast bfloat16, each in
# NCHW and channels_last.
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    reps, batch, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    # Each mode has its own model and optimizer from the same seed; "_cl" runs model and input channels_last, the
    # faster layout for PyTorch's CPU convolutions and pooling.
    def make_step(bf16, channels_last):
        torch.manual_seed(0)
        model = SimpleCNN()
        xm = x
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            xm = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xm), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    modes = {"float32": make_step(False, False), "autocast_bf16": make_step(True, False),
             "float32_cl": make_step(False, True), "autocast_bf16_cl": make_step(True, True)}
    for step in modes.values():  # warm-up
        step()
        step()
    times = {name: [] for name in modes}
    for _ in range(reps):  # alternating, as amp_bench does
        for name, step in modes.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    print(f"threads {torch.get_num_threads()}")
    for name in modes:
        print(f"{name} {batch / statistics.median(times[name]):.2f}")


if __name__ == "__main__":
    main()
