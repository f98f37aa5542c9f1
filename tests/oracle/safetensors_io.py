"""Independent safetensors reader/writer on top of PyTorch, used as an interop oracle by the Castor tests.

usage: safetensors_io.py write FILE   writes expected() and METADATA to FILE (reverse name order, unpadded header)
       safetensors_io.py verify FILE  reads FILE (as written by Castor) and checks it bit for bit against expected()
"""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}
METADATA = {"producer": "castor", "note": "caf\u00e9 \U0001F9AB \"quoted\""}
INF = float("inf")


def expected():
    """The tensors both sides agree on; tests/io/safetensors_test.cpp spells out the same values as raw bits."""
    half_vals = [-2.5, 1.0, 65504.0, 2.0 ** -24, -0.0, INF, 0.1, 1 / 3]
    bf16_vals = [-2.5, 1.0, 3.3895313892515355e38, 2.0 ** -133, -0.0, INF, 0.1, 1 / 3]
    return {
        "f32": torch.tensor([0.1, -1e-30, 3.4e38, -0.0, INF, 1e-45, 1 / 3, -7.0], dtype=torch.float32).reshape(2, 4),
        "f16": torch.tensor(half_vals, dtype=torch.float16).reshape(4, 2),
        "bf16": torch.tensor(bf16_vals, dtype=torch.bfloat16).reshape(2, 2, 2),
        "f64": torch.tensor([0.1, -1e300, 5e-324, -0.0, INF, 1 / 3], dtype=torch.float64).reshape(3, 2),
        "i64": torch.tensor([-2 ** 63, -1, 0, 2 ** 63 - 1], dtype=torch.int64),
        "i32": torch.tensor([-2 ** 31, -7, 0, 2 ** 31 - 1], dtype=torch.int32).reshape(2, 2),
        "u8": torch.tensor([0, 1, 127, 128, 255, 42], dtype=torch.uint8).reshape(1, 2, 3),
        "bool": torch.tensor([True, False, False, True, True]),
        "rank0": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float16),
    }


def raw_bytes(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())


def read(path):
    """Returns ({name: tensor}, metadata, header length, names in data order)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    buf = data[8 + n:]
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        chunk = bytearray(buf[begin:end])
        flat = torch.frombuffer(chunk, dtype=dtype) if chunk else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(e["shape"])
    order = sorted(header, key=lambda k: tuple(header[k]["data_offsets"]))
    return tensors, metadata, n, order


def write(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors, reverse=True):  # a layout Castor's writer never produces
        t = tensors[name]
        raw = raw_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def verify(path):
    tensors, metadata, n, order = read(path)
    want = expected()
    errors = []
    if n % 8:
        errors.append(f"header length {n} is not a multiple of 8")
    if order != sorted(want):
        errors.append(f"data order {order} is not sorted by name")
    if metadata != METADATA:
        errors.append(f"metadata {metadata!r} != {METADATA!r}")
    if sorted(tensors) != sorted(want):
        errors.append(f"names {sorted(tensors)} != {sorted(want)}")
    for name in sorted(set(tensors) & set(want)):
        got, exp = tensors[name], want[name]
        if got.dtype != exp.dtype or got.shape != exp.shape:
            errors.append(f"{name}: {got.dtype}{list(got.shape)} != {exp.dtype}{list(exp.shape)}")
        elif raw_bytes(got) != raw_bytes(exp) or not torch.equal(got, exp):
            errors.append(f"{name}: values {got.tolist()} != {exp.tolist()}")
    for e in errors:
        print(e)
    return not errors


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "verify"):
        sys.exit(__doc__)
    if sys.argv[1] == "write":
        write(sys.argv[2], expected(), METADATA)
    elif not verify(sys.argv[2]):
        sys.exit(1)
