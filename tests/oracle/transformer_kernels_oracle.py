# PyTorch oracle for tests/kernels/transformer_kernels_test.cpp: layer norm and cross-entropy results as PyTorch
# computes them, written to <dir>/<case>.bin (the format of functional_oracle.py: per tensor u32 name length, name,
# u32 kind (0 float64, 1 int64), u32 ndim, i64 dims, data).
#
# Inputs are values of the case's dtype; results are PyTorch's in that dtype, widened exactly to float64.
# Cross-entropy on bfloat16 logits is what CPU autocast runs: F.cross_entropy on the float32 widening, its logits
# gradient rounded once to bfloat16 by the cast's backward.
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import write_case  # noqa: E402

OUT = sys.argv[1]


def write(case, tensors):
    write_case(OUT, case, tensors)


def layer_norm_cases():
    for dt_name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        g = torch.Generator().manual_seed(1)
        C = 768
        x = (torch.randn(2, 33, C, generator=g) * 2 + torch.randn(2, 33, 1, generator=g)).to(dt).requires_grad_()
        w = (1 + 0.3 * torch.randn(C, generator=g)).to(dt).requires_grad_()
        b = (0.3 * torch.randn(C, generator=g)).to(dt).requires_grad_()
        y = F.layer_norm(x, (C,), w, b, 1e-5)
        gy = torch.randn(y.shape, generator=g).to(dt)
        dx, dw, db = torch.autograd.grad(y, [x, w, b], gy)
        write(f"layer_norm_{dt_name}", {"x": x, "w": w, "b": b, "gy": gy, "y": y, "dx": dx, "dw": dw, "db": db})


def cross_entropy_cases():
    for dt_name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        for smoothing in (0.0, 0.1):
            g = torch.Generator().manual_seed(2)
            N, V = 6, 50257
            logits = (3 * torch.randn(N, V, generator=g)).to(dt)
            target = torch.randint(0, V, (N,), generator=g)
            target[2] = -100
            x = logits.float().requires_grad_()
            losses = F.cross_entropy(x, target, reduction="none", ignore_index=-100, label_smoothing=smoothing)
            gl = torch.randn(N, generator=g)
            (dx,) = torch.autograd.grad(losses, [x], gl)
            write(f"cross_entropy_{dt_name}_{smoothing}",
                  {"logits": logits, "target": target, "gl": gl, "losses": losses, "dx": dx.to(dt)})


layer_norm_cases()
cross_entropy_cases()
