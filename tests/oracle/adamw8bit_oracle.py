# The 8-bit AdamW oracle (Dettmers et al. 2021; bitsandbytes' dynamic maps and 8-bit blockwise update), in numpy.
# Usage: adamw8bit_oracle.py map|quantize|update '<json config>' <output dir>; writes raw little-endian files.
import json
import math
import os
import sys

import numpy as np
import torch

f32 = np.float32


def dynamic_map(signed):  # create_dynamic_map(signed, 7, 8) in double, each value rounded to float32 once
    data = []
    for i in range(7):
        n = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        for k in range(n - 1):
            v = float('1e%d' % (i - 6)) * ((0.1 + 0.9 * k / (n - 1) + (0.1 + 0.9 * (k + 1) / (n - 1))) / 2.0)
            data += [v, -v] if signed else [v]
    code = np.sort(np.array(data + [0.0, 1.0]).astype(f32))
    # bitsandbytes computes the same map in float32 (torch.linspace): within a few float32 ulps of it
    bnb = []
    for i in range(7):
        b = torch.linspace(0.1, 1, 2 ** i + 1 if signed else 2 ** (i + 1) + 1, dtype=torch.float32)
        m = ((10 ** (i - 6)) * ((b[:-1] + b[1:]) / 2.0)).tolist()
        bnb += m + [-x for x in m] if signed else m
    assert np.allclose(code, np.sort(np.array(bnb + [0.0, 1.0], dtype=f32)), rtol=4e-7, atol=0), 'map'
    return code, ((code[:-1] + code[1:]) * f32(0.5)).astype(f32)


def quantize(x, block, signed):  # nearest code (ties to the lower), per block of x / absmax
    code, mid = dynamic_map(signed)
    codes, absmax = np.zeros(x.size, np.uint8), np.zeros((x.size + block - 1) // block, f32)
    for k in range(absmax.size):
        s = x[k * block:(k + 1) * block]
        a = absmax[k] = np.max(np.abs(s))
        with np.errstate(all='ignore'):
            idx = np.searchsorted(mid, s / a if a > 0 else np.zeros_like(s), side='left')
        if signed:  # a negative value keeps its sign
            idx -= ((s < 0) & (code[idx] >= 0)).astype(idx.dtype)
        codes[k * block:(k + 1) * block] = idx
    return codes, absmax


def dequantize(codes, absmax, block, signed):
    return (dynamic_map(signed)[0][codes] * np.repeat(absmax, block)[:codes.size]).astype(f32)


def update(cfg, w, g, st, step):  # one AdamW8bit step: dequantise, update (float32, no fused multiply-add), requantise
    lr, wd, b1, b2, eps, block = cfg['lr'], cfg['weight_decay'], cfg['beta1'], cfg['beta2'], cfg['eps'], cfg['block']
    neg_step, bc2 = f32(-(lr / (1 - b1 ** step))), f32(math.sqrt(1 - b2 ** step))
    m = dequantize(*st[0], block, True) * f32(b1) + g * f32(1 - b1)
    v = dequantize(*st[1], block, False) * f32(b2) + (f32(1 - b2) * g) * g
    w = w * f32(1 - lr * wd) + (neg_step * m) / (np.sqrt(v) / bc2 + f32(eps))
    return w.astype(f32), [quantize(m.astype(f32), block, True), quantize(v.astype(f32), block, False)]


def main():
    mode, cfg, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    write = lambda name, a: a.tofile(os.path.join(out, name + '.bin'))
    if mode == 'map':
        for signed in (True, False):
            write('map_signed' if signed else 'map_unsigned', dynamic_map(signed)[0])
    elif mode == 'quantize':  # cases: x_<k>.bin given by the test as raw float32, cfg a list of {block, signed}
        for k, case in enumerate(cfg):
            x = np.fromfile(os.path.join(out, f'x_{k}.bin'), f32)
            codes, absmax = quantize(x, case['block'], case['signed'])
            write(f'codes_{k}', codes), write(f'absmax_{k}', absmax)
            write(f'dequantized_{k}', dequantize(codes, absmax, case['block'], case['signed']))
    else:  # update: w and grads made here; a small parameter with 32-bit states goes through torch's AdamW
        rng = np.random.default_rng(cfg['seed'])
        n = cfg['n']
        w = rng.standard_normal(n).astype(f32)
        small = torch.randn(cfg['small'], generator=torch.Generator().manual_seed(cfg['seed'])).requires_grad_()
        write('init', w), write('init_small', small.detach().numpy())
        opt = torch.optim.AdamW([small], lr=cfg['lr'], betas=(cfg['beta1'], cfg['beta2']), eps=cfg['eps'],
                                weight_decay=cfg['weight_decay'], foreach=False)
        st = [quantize(np.zeros(n, f32), cfg['block'], True), quantize(np.zeros(n, f32), cfg['block'], False)]
        for step in range(1, cfg['steps'] + 1):
            g = (rng.standard_normal(n) * cfg['grad_scale']).astype(f32)
            small.grad = torch.randn(cfg['small'])
            write(f'grad_{step}', g), write(f'grad_small_{step}', small.grad.numpy())
            w, st = update(cfg, w, g, st, step)
            opt.step()
            write(f'weight_{step}', w), write(f'weight_small_{step}', small.detach().numpy())
            for k, name in enumerate(('exp_avg', 'exp_avg_sq')):
                write(f'{name}_code_{step}', st[k][0]), write(f'{name}_absmax_{step}', st[k][1])


if __name__ == '__main__':
    main()
