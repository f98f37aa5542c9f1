"""GGUF files and ggml's Q8_0 blocks re-implemented from their specifications (ggml docs/gguf.md; ggml-quants.c's
quantize_row_q8_0_ref and dequantize_row_q8_0, ggml-common.h's block_q8_0), numpy only: the oracle of Castor's GGUF
writer and its Q8_0 quantizer.

  gguf_oracle.py q8_0 IN.f32 OUT_BLOCKS OUT_DEQUANTIZED.f32   ggml's blocks of float32 values, and their values back
  gguf_oracle.py read FILE.gguf OUT_DIR                         the header and key-values as JSON on stdout; each
                                                                 tensor's data as OUT_DIR/<name>.bin
"""
import json
import struct
import sys

import numpy as np

QK8_0 = 32


def roundf(v):
    """C's roundf in float32: halfway cases away from zero (not numpy's round-half-even)."""
    t = np.trunc(v)
    frac = v - t  # exact in float32
    return np.where(np.abs(frac) >= np.float32(0.5), t + np.sign(v), t).astype(np.float32)


def quantize_q8_0(x):
    """quantize_row_q8_0_ref: d = amax / 127 (float32), id = 1 / d or 0, q = roundf(x * id); d stored as float16."""
    blocks = x.astype(np.float32).reshape(-1, QK8_0)
    out = bytearray()
    for b in blocks:
        amax = np.float32(np.max(np.abs(b)))
        d = np.float32(amax / np.float32(127))
        inv = np.float32(np.float32(1) / d) if d != 0 else np.float32(0)
        q = roundf((b * inv).astype(np.float32)).astype(np.int8)
        out += np.float16(d).tobytes() + q.tobytes()  # float16 conversion rounds to nearest even, as F16C / ggml's
    return bytes(out)


def dequantize_q8_0(data):
    """dequantize_row_q8_0: y = q * float(d), in float32."""
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 2 + QK8_0)
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)
    q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).astype(np.float32).reshape(-1)


VALUE = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type -> (block values, block bytes), ggml-common.h's blocks
TYPE_SIZE = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
             11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            elem, n = self.take("<I"), self.take("<Q")
            return [self.value(elem) for _ in range(n)]
        v = self.take(VALUE[t])
        return float(v) if t == 6 else v


def read_gguf(path, out_dir):
    data = open(path, "rb").read()
    r = Reader(data)
    assert data[:4] == b"GGUF", "magic"
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kv, kv_types = {}, {}
    for _ in range(n_kv):
        key = r.string()
        t = r.take("<I")
        kv[key], kv_types[key] = r.value(t), t
    align = kv.get("general.alignment", 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    start = (r.pos + align - 1) // align * align
    assert all(b == 0 for b in data[r.pos:start]), "padding"
    tensors = {}
    for name, ne, t, off in infos:
        assert off % align == 0, name
        values, size = TYPE_SIZE[t]
        n = int(np.prod(ne)) // values * size
        with open(f"{out_dir}/{name}.bin", "wb") as f:
            f.write(data[start + off:start + off + n])
        tensors[name] = {"ne": ne, "type": t, "offset": off}
    # Scalars' GGUF types, so a test can check them (arrays: their element values only).
    types = {k: t for k, t in kv_types.items()}
    print(json.dumps({"version": version, "kv": kv, "kv_types": types, "tensors": tensors, "data_start": start,
                      "file_bytes": len(data)}))


def main():
    if sys.argv[1] == "q8_0":
        x = np.fromfile(sys.argv[2], dtype=np.float32)
        blocks = quantize_q8_0(x)
        open(sys.argv[3], "wb").write(blocks)
        dequantize_q8_0(blocks).tofile(sys.argv[4])
    elif sys.argv[1] == "read":
        read_gguf(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: gguf_oracle.py q8_0 IN OUT_BLOCKS OUT_DEQ | read FILE OUT_DIR")


if __name__ == "__main__":
    main()
