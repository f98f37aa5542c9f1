"""The oracles' case files, read by test::read_oracle_case (tests/test_util.cpp): per tensor u32 name length, name,
u32 kind (0 float64, 1 int64), u32 ndim, i64 dims, then the data (floats widened exactly to float64)."""
import struct

import torch


def write_case(out_dir, case, tensors):
    with open(f"{out_dir}/{case}.bin", "wb") as f:
        for name, t in tensors.items():
            t = torch.as_tensor(t).detach()
            is_int = t.dtype == torch.int64
            data = t.to(torch.int64 if is_int else torch.float64).contiguous()
            f.write(struct.pack("<I", len(name)) + name.encode())
            f.write(struct.pack("<II", 1 if is_int else 0, data.dim()))
            f.write(struct.pack(f"<{data.dim()}q", *data.shape))
            f.write(data.numpy().tobytes())
