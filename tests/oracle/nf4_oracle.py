# NF4 (QLoRA, Dettmers et al. 2023) as bitsandbytes quantizes it (functional.py quantize_4bit / kernels.cu
# kQuantizeBlockwise, dQuantizeNF4, kDequantizeBlockwise), in numpy: the dequantized weights with and without double
# quantization of the absmaxes.
# Usage: nf4_oracle.py <x.f32> <out dir>; writes plain.f32 and double.f32 (raw little-endian float32).
import math
import os
import sys

import numpy as np
import torch

import adamw8bit_oracle

f32 = np.float32

# bitsandbytes' get_4bit_type('nf4') table.
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], f32)


def normal_map():  # create_normal_map(0.9677083, use_extra_value=True), from the paper's construction, in float64
    ppf = lambda p: math.sqrt(2) * torch.erfinv(torch.tensor(2 * p - 1, dtype=torch.float64)).item()
    pos = [ppf(0.9677083 + (0.5 - 0.9677083) * k / 8) for k in range(8)]
    neg = [-ppf(0.9677083 + (0.5 - 0.9677083) * k / 7) for k in range(7)]
    v = np.sort(np.array(pos + [0.0] + neg))
    return v / v.max()


# dQuantizeNF4's thresholds: the midpoints of neighbouring codes; x above one takes the upper code.
MID = ((NF4[:-1].astype(np.float64) + NF4[1:].astype(np.float64)) / 2).astype(f32)


def quantize(x):  # blocks of 64 of the flattened tensor: fp32 absmax, codes of x * (1 / absmax)
    blocks = x.reshape(-1, 64)
    absmax = np.max(np.abs(blocks), axis=1).astype(f32)
    with np.errstate(all='ignore'):
        v = (blocks * (f32(1) / absmax)[:, None]).astype(f32)
    codes = (v[:, :, None] > MID[None, None, :]).sum(axis=2)  # NaN exceeds none: code 0
    return codes, absmax


def dequantize(codes, absmax):
    return (NF4[codes] * absmax[:, None]).astype(f32).reshape(-1)


def double_quantize(absmax):  # QLoRA: the mean subtracted, the rest by the signed 8-bit dynamic map in blocks of 256
    offset = f32(np.mean(absmax.astype(np.float64)))
    codes, scales = adamw8bit_oracle.quantize((absmax - offset).astype(f32), 256, True)
    return (adamw8bit_oracle.dequantize(codes, scales, 256, True) + offset).astype(f32)


def main():
    assert np.allclose(NF4, normal_map(), atol=1e-6), 'the NF4 table is not the normal map'
    x = np.fromfile(sys.argv[1], f32)
    codes, absmax = quantize(x)
    dequantize(codes, absmax).tofile(os.path.join(sys.argv[2], 'plain.f32'))
    dequantize(codes, double_quantize(absmax)).tofile(os.path.join(sys.argv[2], 'double.f32'))


if __name__ == '__main__':
    main()
