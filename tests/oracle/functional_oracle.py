# PyTorch oracle for tests/nn/functional_test.cpp: writes each case's inputs and float64 reference results to <dir>/<case>.bin.
#
# Inputs are rounded to the case's dtype (so they are exact there) and every reference is computed in float64 from
# them. File format, per tensor: u32 name length, name, u32 kind (0 float64, 1 int64), u32 ndim, i64 dims, data.
import zlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import write_case  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
OUT = sys.argv[1]


def write(case, tensors):
    write_case(OUT, case, tensors)


def rounded(t, dtype):
    """t rounded to `dtype`, as float64."""
    return t.to(DTYPES[dtype]).to(torch.float64)


def leaf(t):
    return t.clone().requires_grad_(True)


def grads(out, gy, inputs):
    return torch.autograd.grad(out, [t for t in inputs if t is not None], gy)


CONV = {  # name: (x shape, weight shape, bias, stride, padding, dilation, groups)
    "conv_basic": ((2, 3, 7, 6), (4, 3, 3, 3), True, (1, 1), (0, 0), (1, 1), 1),
    "conv_stride_pad": ((2, 3, 9, 8), (5, 3, 3, 2), True, (2, 1), (1, 2), (1, 1), 1),
    "conv_dilation_nobias": ((1, 2, 10, 9), (3, 2, 3, 3), False, (1, 2), (2, 1), (2, 3), 1),
    "conv_groups": ((2, 4, 8, 8), (6, 2, 3, 3), True, (2, 2), (1, 1), (1, 1), 2),
    "conv_depthwise": ((2, 4, 6, 6), (4, 1, 3, 3), False, (1, 1), (1, 1), (1, 1), 4),
    "conv_simplecnn": ((4, 3, 16, 16), (8, 3, 3, 3), True, (1, 1), (1, 1), (1, 1), 1),
}


def conv_cases():
    for name, (xs, ws, has_b, stride, padding, dilation, groups) in CONV.items():
        for dt in DTYPES:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            x = leaf(rounded(torch.randn(xs, generator=g), dt))
            w = leaf(rounded(torch.randn(ws, generator=g) * 0.3, dt))
            b = leaf(rounded(torch.randn(ws[0], generator=g), dt)) if has_b else None
            y = F.conv2d(x, w, b, stride, padding, dilation, groups)
            gy = rounded(torch.randn(y.shape, generator=g), dt)
            gs = grads(y, gy, [x, w, b])
            out = {"x": x, "w": w, "gy": gy, "y": y, "dx": gs[0], "dw": gs[1],
                   "params": torch.tensor([*stride, *padding, *dilation, groups])}
            if has_b:
                out.update(b=b, db=gs[2])
            write(f"{name}_{dt}", out)


BN = {  # name: (x shape, affine, training)
    "bn_train_4d": ((4, 3, 5, 5), True, True),
    "bn_train_2d": ((8, 5), True, True),
    "bn_train_noaffine": ((3, 4, 3, 3), False, True),
    "bn_eval_4d": ((4, 3, 5, 5), True, False),
}


def bn_cases():
    for name, (xs, affine, training) in BN.items():
        for dt in DTYPES:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            stat = torch.float64 if dt == "float64" else torch.float32
            x = leaf(rounded(torch.randn(xs, generator=g) * 2 + 0.5, dt))
            c = xs[1]
            w = leaf((torch.rand(c, generator=g) + 0.5).to(stat).double()) if affine else None
            b = leaf(torch.randn(c, generator=g).to(stat).double()) if affine else None
            rm = torch.randn(c, generator=g).to(stat).double()
            rv = (torch.rand(c, generator=g) + 0.5).to(stat).double()
            out = {"x": x, "running_mean": rm.clone(), "running_var": rv.clone(),
                   "params": torch.tensor([int(training), int(affine)])}
            y = F.batch_norm(x, rm, rv, w, b, training, momentum=0.1, eps=1e-5)
            gy = rounded(torch.randn(y.shape, generator=g), dt)
            gs = grads(y, gy, [x, w, b])
            out.update(y=y, gy=gy, dx=gs[0], running_mean_after=rm, running_var_after=rv)
            if affine:
                out.update(w=w, b=b, dw=gs[1], db=gs[2])
            write(f"{name}_{dt}", out)


POOL = {  # name: (x shape, kind (0 max, 1 avg, 2 adaptive avg), kernel or output size, stride, padding, count_include_pad)
    "maxpool_k3s2p1": ((2, 3, 9, 8), 0, (3, 3), (2, 2), (1, 1), True),
    "maxpool_k2": ((2, 3, 8, 8), 0, (2, 2), (2, 2), (0, 0), True),
    "avgpool_k3s2p1_incl": ((2, 3, 9, 8), 1, (3, 3), (2, 2), (1, 1), True),
    "avgpool_k3s2p1_excl": ((2, 3, 9, 8), 1, (3, 3), (2, 2), (1, 1), False),
    "avgpool_k2x3s1": ((2, 2, 6, 7), 1, (2, 3), (1, 1), (0, 1), True),
    "adaptive_5x7_to_3x4": ((2, 3, 5, 7), 2, (3, 4), None, None, None),
    "adaptive_8x8_to_2x2": ((2, 3, 8, 8), 2, (2, 2), None, None, None),
    "adaptive_to_1x1": ((2, 3, 5, 6), 2, (1, 1), None, None, None),
}


def pool_cases():
    for name, (xs, kind, k, s, p, incl) in POOL.items():
        for dt in DTYPES:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            n = torch.Size(xs).numel()
            # Distinct values, exact in every dtype (no ties for max pooling): multiples of 1/16 below 16 in magnitude.
            x = leaf(((torch.randperm(n, generator=g) - n // 2).double() / 16).view(xs))
            if kind == 0:
                y = F.max_pool2d(x, k, s, p)
            elif kind == 1:
                y = F.avg_pool2d(x, k, s, p, count_include_pad=incl)
            else:
                y = F.adaptive_avg_pool2d(x, k)
            gy = rounded(torch.randn(y.shape, generator=g), dt)
            (dx,) = grads(y, gy, [x])
            params = [kind, *k, *(s or (0, 0)), *(p or (0, 0)), int(bool(incl))]
            write(f"{name}_{dt}", {"x": x, "y": y, "gy": gy, "dx": dx, "params": torch.tensor(params)})


LOSS_VARIANTS = {"ce": ["plain", "smooth", "ignore", "weight", "all"], "nll": ["plain", "ignore", "weight"],
                 "mse": ["plain"], "bcel": ["plain"], "bce": ["plain"]}
REDUCTIONS = ["none", "mean", "sum"]


def loss_cases():
    for fn, variants in LOSS_VARIANTS.items():
        for variant in variants:
            for red in REDUCTIONS:
                for dt in ("float32", "float64"):
                    name = f"{fn}_{variant}_{red}_{dt}"
                    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                    n, c = 7, 5
                    smoothing = 0.2 if variant in ("smooth", "all") else 0.0
                    ignore = 2 if variant in ("ignore", "all") else -100
                    weight = (torch.rand(c, generator=g) + 0.5).double() if variant in ("weight", "all") else None
                    out = {"params": torch.tensor([ignore]), "smoothing": torch.tensor([smoothing], dtype=torch.float64)}
                    if fn in ("ce", "nll"):
                        x = leaf(rounded(torch.randn(n, c, generator=g) * 2, dt))
                        target = torch.randint(0, c, (n,), generator=g)
                        target[1] = 2  # at least one ignored sample in the ignore variants
                        if fn == "ce":
                            y = F.cross_entropy(x, target, weight, ignore_index=ignore, reduction=red,
                                                label_smoothing=smoothing)
                        else:
                            y = F.nll_loss(torch.log_softmax(x, 1), target, weight, ignore_index=ignore, reduction=red)
                        out["target"] = target
                    else:
                        x = leaf(rounded(torch.randn(n, c, generator=g) * 3, dt))
                        if fn == "bcel":
                            x = leaf(torch.cat([x.detach()[:-1], torch.tensor([[30.0, -30.0, 0.0, 15.0, -15.0]])]))
                        if fn == "bce":
                            x = leaf(rounded(torch.rand(n, c, generator=g) * 0.98 + 0.01, dt))
                        t = rounded(torch.rand(n, c, generator=g), dt)
                        if fn == "mse":
                            y = F.mse_loss(x, t, reduction=red)
                        elif fn == "bcel":
                            y = F.binary_cross_entropy_with_logits(x, t, reduction=red)
                        else:
                            y = F.binary_cross_entropy(x, t, reduction=red)
                        out["target"] = t
                    gy = rounded(torch.randn(y.shape, generator=g), dt)
                    (dx,) = grads(y, gy, [x])
                    out.update(x=x, y=y, gy=gy, dx=dx)
                    if weight is not None:
                        out["weight"] = weight
                    write(name, out)


torch.manual_seed(0)
conv_cases()
bn_cases()
pool_cases()
loss_cases()
