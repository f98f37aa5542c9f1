# PyTorch oracle for tests/core/torch_parity_test.cpp: runs every case forward and backward in float32, float16
# and bfloat16 and writes a manifest plus raw little-endian tensor files into the directory given as argv[1].
#
# manifest.txt lines:
#   tensor <name> <dtype> <ndim> <dims...>      (bytes in <name>.bin)
#   case <name> <op> <dtype> <class> <n_inputs> (tensors <name>.in<i>, .out, .gout, .grad<i> for float inputs)
#   promote <dtype_a> <ndim_a> <dtype_b> <ndim_b> <torch.result_type>
# Reference policy (the contract is "16-bit inputs are computed in float32 and rounded once"):
#  - float32 everywhere, and the exact-class ops in float16/bfloat16: PyTorch's own kernels and autograd.
#  - Where PyTorch 1.13 has no CPU float16 kernel ("not implemented for 'Half'"), and for every 16-bit case of
#    the ulp and reduce classes: the forward in float32 from the 16-bit inputs, rounded once (PyTorch's native
#    bfloat16 forward is kept where it exists, except mm/matmul: without AVX-512 its CPU bfloat16 gemm
#    accumulates in bfloat16, 38 ulps off); the backward is PyTorch's derivative formula evaluated in float32 on
#    the 16-bit saved values, rounded once (its bfloat16 softmax/gelu backward kernels round intermediate steps).
#  - gelu and gelu_tanh in every dtype: float64 from the inputs, rounded once. PyTorch's float32 forms
#    0.5 x (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(u)) cancel for x << 0 (hundreds of float32 ulps).
import os
import sys

import torch
import torch.nn.functional as F

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


LO, HI = -0.5, 0.75  # clamp bounds, exact in every dtype

# op -> (forward on a list of tensors, class, input makers(dtype) -> list of tensors)
# Classes, "<forward>:<backward>": exact (bit-identical), ulp (transcendental: within 1 ulp of a 16-bit type),
# reduce (reductions, matmul, broadcast and softmax backward: a sum's tolerance, see torch_parity_test.cpp).
def normal(*shape):
    return lambda d: torch.randn(*shape).to(d)


def positive(*shape):
    return lambda d: (torch.rand(*shape) * 4 + 0.25).to(d)


def boolean(*shape):
    return lambda d: torch.rand(*shape) > 0.5


def special_f32():
    # Rounding edge cases for casts: float16 overflow and its boundary, subnormals, ties, huge values.
    v = torch.tensor([65504.0, 65519.0, 65520.0, 1e-8, -3e-5, 6e-8, 1e38, -1e38, float("inf"), 1.00390625,
                      1.01171875, 3.0000002, -0.0, 2.0 ** -126, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11])
    return lambda d: torch.cat([v, torch.randn(48) * 100]).view(4, 16)


# gather's index (6, 4) into a (6, 7) input, as tests/core/torch_parity_test.cpp builds it.
GATHER_INDEX = torch.tensor([[(i * 3 + j * 2) % 7 for j in range(4)] for i in range(6)])


def sixteen(d):
    return torch.bfloat16 if d == torch.float32 else torch.float32


OPS = {
    "add": (lambda x: x[0] + x[1], "exact:exact", [normal(6, 7), normal(6, 7)]),
    "sub_alpha": (lambda x: torch.sub(x[0], x[1], alpha=0.5), "exact:exact", [normal(6, 7), normal(6, 7)]),
    "mul": (lambda x: x[0] * x[1], "exact:exact", [normal(6, 7), normal(6, 7)]),
    "div": (lambda x: x[0] / x[1], "exact:exact", [normal(6, 7), positive(6, 7)]),
    "neg": (lambda x: -x[0], "exact:exact", [normal(6, 7)]),
    "relu": (lambda x: torch.relu(x[0]), "exact:exact", [normal(6, 7)]),
    "abs": (lambda x: torch.abs(x[0]), "exact:exact", [normal(6, 7)]),
    "sqrt": (lambda x: torch.sqrt(x[0]), "exact:exact", [positive(6, 7)]),
    "clamp": (lambda x: torch.clamp(x[0], LO, HI), "exact:exact", [normal(6, 7)]),
    "where": (lambda x: torch.where(x[0], x[1], x[2]), "exact:exact", [boolean(6, 7), normal(6, 7), normal(6, 7)]),
    "cast_from": (lambda x: x[0].to(sixteen(x[0].dtype)), "exact:exact", [normal(6, 7)]),
    "cast_to": (None, "exact:exact", None),  # float32 input with special values, cast to the case dtype
    "exp": (lambda x: torch.exp(x[0]), "ulp:ulp", [normal(6, 7)]),
    "log": (lambda x: torch.log(x[0]), "ulp:ulp", [positive(6, 7)]),
    "tanh": (lambda x: torch.tanh(x[0]), "ulp:ulp", [normal(6, 7)]),
    "sigmoid": (lambda x: torch.sigmoid(x[0]), "ulp:ulp", [normal(6, 7)]),
    "gelu": (lambda x: F.gelu(x[0]), "ulp:ulp", [normal(6, 7)]),
    "gelu_tanh": (lambda x: F.gelu(x[0], approximate="tanh"), "ulp:ulp", [normal(6, 7)]),
    "softmax": (lambda x: torch.softmax(x[0], -1), "ulp:reduce", [normal(6, 9)]),
    "log_softmax": (lambda x: torch.log_softmax(x[0], -1), "ulp:reduce", [normal(6, 9)]),
    "softmax_dim0": (lambda x: torch.softmax(x[0], 0), "ulp:reduce", [normal(6, 9)]),
    "sum_dim": (lambda x: x[0].sum(1), "reduce:reduce", [normal(5, 300, 3)]),
    "mean_dim": (lambda x: x[0].mean(-1), "reduce:reduce", [normal(7, 300)]),
    "sum_all": (lambda x: x[0].sum(), "reduce:reduce", [normal(40, 50)]),
    "add_broadcast": (lambda x: x[0] + x[1], "reduce:reduce", [normal(64, 7), normal(7)]),
    "mm": (lambda x: x[0] @ x[1], "reduce:reduce", [normal(16, 64), normal(64, 8)]),
    "addmm": (lambda x: torch.addmm(x[0], x[1], x[2]), "reduce:reduce", [normal(8), normal(16, 64), normal(64, 8)]),
    "matmul_batched": (lambda x: torch.matmul(x[0], x[1]), "reduce:reduce", [normal(2, 1, 5, 32), normal(3, 32, 4)]),
    "bmm": (lambda x: torch.bmm(x[0], x[1]), "reduce:reduce", [normal(3, 5, 32), normal(3, 32, 4)]),
    "pow3": (lambda x: x[0] ** 3, "ulp:ulp", [normal(6, 7)]),
    "silu": (lambda x: F.silu(x[0]), "ulp:ulp", [normal(6, 7)]),
    "max_dim": (lambda x: x[0].max(1).values, "exact:exact", [normal(6, 7)]),
    "min_dim": (lambda x: x[0].min(0).values, "exact:exact", [normal(6, 7)]),
    "cat": (lambda x: torch.cat([x[0], x[1]], 1), "exact:exact", [normal(6, 7), normal(6, 3)]),
    "stack": (lambda x: torch.stack([x[0], x[1]], 0), "exact:exact", [normal(6, 7), normal(6, 7)]),
    "gather": (lambda x: torch.gather(x[0], 1, GATHER_INDEX), "exact:reduce", [normal(6, 7)]),
    "masked_fill": (lambda x: x[0].masked_fill(x[1], 2.5), "exact:exact", [normal(6, 7), boolean(6, 7)]),
    "permute": (lambda x: x[0].permute(1, 0, 2), "exact:exact", [normal(3, 4, 5)]),
    "expand": (lambda x: x[0].expand(3, 6, 7), "exact:reduce", [normal(1, 6, 7)]),
    "slice": (lambda x: x[0][:, 1:6:2], "exact:exact", [normal(6, 7)]),
    "clone": (lambda x: x[0].clone(), "exact:exact", [normal(6, 7)]),
    "view": (lambda x: x[0].view(7, 6), "exact:exact", [normal(6, 7)]),
}


LATER = {"addmm": 1}  # op -> its own seed (see main)


# PyTorch's derivative formulas (derivatives.yaml) in float32 on the 16-bit saved values.
def f32_backward(op, x, y, g):
    if op == "relu":
        return [torch.where(y <= 0, torch.zeros_like(g), g)]
    if op == "sqrt":
        return [g / (2 * y)]
    if op == "clamp":
        return [torch.where((x[0] >= LO) & (x[0] <= HI), g, torch.zeros_like(g))]
    if op == "exp":
        return [g * y]
    if op == "log":
        return [g / x[0]]
    if op == "tanh":
        return [torch.ops.aten.tanh_backward(g, y)]
    if op == "sigmoid":
        return [torch.ops.aten.sigmoid_backward(g, y)]
    if op in ("softmax", "softmax_dim0"):
        return [torch.ops.aten._softmax_backward_data(g, y, -1 if op == "softmax" else 0, torch.float32)]
    if op == "log_softmax":
        return [torch.ops.aten._log_softmax_backward_data(g, y, -1, torch.float32)]
    if op == "mm":
        return [g @ x[1].t(), x[0].t() @ g]
    if op == "addmm":
        return [g.sum(0), g @ x[2].t(), x[1].t() @ g]
    if op == "matmul_batched":
        ga = torch.matmul(g, x[1].transpose(-1, -2)).sum(1, keepdim=True)
        gb = torch.matmul(x[0].transpose(-1, -2), g).sum(0)
        return [ga, gb]
    if op == "bmm":
        return [torch.bmm(g, x[1].transpose(1, 2)), torch.bmm(x[0].transpose(1, 2), g)]
    if op == "expand":
        return [g.sum(0, keepdim=True)]
    if op == "gather":
        return [torch.zeros_like(x[0]).scatter_add(1, GATHER_INDEX, g)]
    if op == "pow3":
        return [g * 3 * x[0] * x[0]]
    if op == "silu":
        return [torch.ops.aten.silu_backward(g, x[0])]
    if op == "sum_dim":
        return [g.unsqueeze(1).expand_as(x[0])]
    if op == "mean_dim":
        return [(g.unsqueeze(-1) / x[0].shape[-1]).expand_as(x[0])]
    if op == "sum_all":
        return [g.expand_as(x[0])]
    if op == "add_broadcast":
        return [g, g.sum(0)]
    raise AssertionError(f"no float32 backward formula for {op}")


def run_case(op, dname):
    d = DTYPES[dname]
    fwd, klass, makers = OPS[op]
    name = f"{op}.{dname}"
    if op == "cast_to":
        if d == torch.float32:
            return  # float32 -> float32 is no cast
        inputs = [special_f32()(torch.float32)]
        fwd = lambda x: x[0].to(d)
    else:
        inputs = [m(d) for m in makers]
    sixteen_bit = d in (torch.float16, torch.bfloat16)
    if op in ("gelu", "gelu_tanh"):
        wide = [t.double().requires_grad_() for t in inputs]
        out64 = fwd(wide)
        out = out64.to(d)
        gout = torch.randn(out.shape).to(d)
        grads = [r.to(d) for r in torch.autograd.grad(out64, wide, gout.double())]
    elif sixteen_bit and klass != "exact:exact":
        up = [t.float() if t.dtype == d else t for t in inputs]
        try:
            if op in ("mm", "addmm", "matmul_batched", "bmm"):
                raise RuntimeError("not implemented for 'Half'")  # see the policy above
            out = fwd(inputs)
        except RuntimeError as e:
            if "not implemented for 'Half'" not in str(e):
                raise
            out = fwd(up).to(d)
        gout = torch.randn(out.shape).to(d)
        grads = [r.to(d) for r in f32_backward(op, up, out.float(), gout.float())]
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
            grads = [r.to(t.dtype) for r, t in zip(f32_backward(op, up, out.float(), gout.float()), inputs)
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
    torch.manual_seed(0)
    for dname in ("float32", "float16", "bfloat16"):
        for op in OPS:
            if op in LATER:
                continue
            run_case(op, dname)
        # Cases added later draw from their own seed, so that the earlier cases keep their values.
        for op in LATER:
            with torch.random.fork_rng():
                torch.manual_seed(LATER[op])
                run_case(op, dname)
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
