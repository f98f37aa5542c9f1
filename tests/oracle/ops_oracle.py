# PyTorch oracle for tests/core/torch_parity_test.cpp: runs every parity case of the op table
# (tests/autograd/op_cases.cpp, listed by the test in <dir>/cases.txt) forward and backward in float32, float16 and
# bfloat16 and writes a manifest plus raw little-endian tensor files into the directory given as argv[1].
#
# cases.txt lines, tab-separated: name class reference dtypes inputs torch f32_grad (see op_cases.h).
# manifest.txt lines:
#   tensor <name> <dtype> <ndim> <dims...>      (bytes in <name>.bin)
#   case <name> <op> <dtype> <class> <n_inputs> (tensors <name>.in<i>, .out, .gout, .grad<i> for float inputs)
#   promote <dtype_a> <ndim_a> <dtype_b> <ndim_b> <torch.result_type>
# Each case draws its inputs and output gradient from its own seed, the CRC-32 of its name.
# Reference policy (the contract is "16-bit inputs are computed in float32 and rounded once"):
#  - float32 everywhere, and the exact-class ops in float16/bfloat16: PyTorch's own kernels and autograd.
#  - Where PyTorch 1.13 has no CPU float16 kernel ("not implemented for 'Half'"), and for every 16-bit case of
#    the ulp and reduce classes: the forward in float32 from the 16-bit inputs, rounded once (PyTorch's native
#    16-bit forward is kept where it exists, unless the case's reference is float32); the backward is the case's
#    derivative formula (PyTorch's) evaluated in float32 on the 16-bit saved values, rounded once (its bfloat16
#    softmax/gelu backward kernels round intermediate steps).
#  - Cases whose reference is float64, in every dtype: float64 from the inputs, rounded once.
import os
import sys
import zlib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
          "bool": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}

out_dir = sys.argv[1]
manifest = []


def write(name, t):
    t = t.detach().contiguous()
    manifest.append(f"tensor {name} {NAMES[t.dtype]} {t.dim()} " + " ".join(str(s) for s in t.shape))
    if t.dtype in (torch.bfloat16, torch.float16):
        raw = t.view(torch.int16).numpy().tobytes()
    elif t.dtype == torch.bool:
        raw = t.to(torch.uint8).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
        f.write(raw)


# Input makers, each (dtype) -> tensor.
def normal(*shape):
    return lambda d: torch.randn(*shape).to(d)


def positive(*shape):
    return lambda d: (torch.rand(*shape) * 4 + 0.25).to(d)


def boolean(*shape):
    return lambda d: torch.rand(*shape) > 0.5


def index(high, *shape):
    return lambda d: torch.randint(0, high, shape)


def special_f32():
    # Rounding edge cases for casts: float16 overflow and its boundary, subnormals, ties, huge values.
    v = torch.tensor([65504.0, 65519.0, 65520.0, 1e-8, -3e-5, 6e-8, 1e38, -1e38, float("inf"), 1.00390625,
                      1.01171875, 3.0000002, -0.0, 2.0 ** -126, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11])
    return lambda d: torch.cat([v, torch.randn(48) * 100]).view(4, 16)


# Rotary embeddings of x (B, T, H, D) at positions start .. start + T - 1, written out from their sources.
def rope_tables(t, dim, start, theta, scaling=None):
    # llama2.c's precompute_freqs_cis (transformers' with rope_scaling), rows start .. start + t - 1.
    angles = torch.outer(torch.arange(start, start + t).float(), rope.inv_freq(dim, theta, scaling))
    return torch.cos(angles)[None, :, None, :], torch.sin(angles)[None, :, None, :]


def rope_interleaved(x, start, theta, scaling=None):
    # llama2.c's apply_rotary_emb: pairs (x[2k], x[2k+1]) as complex numbers times e^(i angle).
    cos, sin = rope_tables(x.size(1), x.size(3), start, theta, scaling)
    xr, xi = x.float().reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(3).type_as(x)


def rope_rotate_half(x, start, theta):
    # Hugging Face's apply_rotary_pos_emb: x cos + rotate_half(x) sin, the angles repeated over both halves.
    cos, sin = rope_tables(x.size(1), x.size(3), start, theta)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    half = x.size(3) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + rotated.float() * sin).type_as(x)


MAKERS = {"normal": normal, "positive": positive, "boolean": boolean, "index": index, "special_f32": special_f32}


def run_case(case, dname):
    op, klass, reference, dtypes, makers, expr, grad_expr = case
    if dname not in dtypes.split():
        return
    d = DTYPES[dname]
    torch.manual_seed(zlib.crc32(op.encode()))
    env = {"torch": torch, "F": F, "d": d, "rope_interleaved": rope_interleaved, "rope_rotate_half": rope_rotate_half}
    fwd = lambda x: eval(expr, {**env, "x": x})
    f32_backward = lambda x, y, g: eval(grad_expr, {**env, "x": x, "y": y, "g": g})
    name = f"{op}.{dname}"
    inputs = [m(d) for m in eval(makers, dict(MAKERS))]
    sixteen_bit = d in (torch.float16, torch.bfloat16)
    if reference == "float64":
        wide = [t.double().requires_grad_() for t in inputs]
        out64 = fwd(wide)
        out = out64.to(d)
        gout = torch.randn(out.shape).to(d)
        grads = [r.to(d) for r in torch.autograd.grad(out64, wide, gout.double())]
    elif sixteen_bit and klass != "exact:exact":
        up = [t.float() if t.dtype == d else t for t in inputs]
        try:
            if reference == "float32":
                raise RuntimeError("not implemented for 'Half'")  # see the policy above
            out = fwd(inputs)
        except RuntimeError as e:
            if "not implemented for 'Half'" not in str(e):
                raise
            out = fwd(up).to(d)
        gout = torch.randn(out.shape).to(d)
        grads = [r.to(d) for r in f32_backward(up, out.float(), gout.float())]
    else:
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        try:
            out = fwd(leaves)
            gout = torch.randn(out.shape).to(out.dtype)
            grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], gout)
        except RuntimeError as e:
            if "not implemented for 'Half'" not in str(e):
                raise
            up = [t.float() if t.dtype == torch.float16 else t for t in inputs]
            out = fwd(up).to(d)
            gout = torch.randn(out.shape).to(d)
            grads = [r.to(t.dtype) for r, t in zip(f32_backward(up, out.float(), gout.float()), inputs)
                     if t.is_floating_point()]
    manifest.append(f"case {name} {op} {dname} {klass} {len(inputs)}")
    for i, t in enumerate(inputs):
        write(f"{name}.in{i}", t)
    write(f"{name}.out", out)
    write(f"{name}.gout", gout)
    gi = iter(grads)
    for i, t in enumerate(inputs):
        if t.is_floating_point():
            write(f"{name}.grad{i}", next(gi))


def main():
    with open(os.path.join(out_dir, "cases.txt")) as f:
        cases = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for dname in ("float32", "float16", "bfloat16"):
        for case in cases:
            run_case(case, dname)
    # Type promotion: every pair of (dtype, 0-dim or 1-dim) operands.
    kinds = [(n, nd) for n in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")
             for nd in (0, 1)]
    for a, an in kinds:
        for b, bn in kinds:
            ta = torch.zeros([2] * an, dtype=DTYPES[a])
            tb = torch.zeros([2] * bn, dtype=DTYPES[b])
            manifest.append(f"promote {a} {an} {b} {bn} {NAMES[torch.result_type(ta, tb)]}")
    with open(os.path.join(out_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
