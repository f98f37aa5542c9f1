"""PEFT's LoRA adapter files as PEFT writes and reads them, with this script's own safetensors reader and writer (no
Castor, no PyTorch), for tests/train/lora_cli_test.cpp.

usage: peft_files.py check DIR EXPECTED   checks DIR/adapter_config.json and DIR/adapter_model.safetensors against
                                          EXPECTED (JSON: "config": fields adapter_config.json must hold, "shapes":
                                          {key: shape}, every tensor F32); prints what differs and exits 1
       peft_files.py write DIR N_EMBD R [bad]   lays out an adapter on every "c_attn" of a one-layer GPT N_EMBD wide:
                                          A[i] = 0.01 * (i % 17 - 8.5), B[i] = 0.02 * (i % 13 - 6.5), lora_alpha 16;
                                          with "bad", lora_B is one column too wide
"""
import json
import os
import struct
import sys

PREFIX = "base_model.model."
PEFT_CONFIG_KEYS = ["peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora",
                    "bias", "fan_in_fan_out", "init_lora_weights", "base_model_name_or_path", "inference_mode"]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for key, e in header.items():
        begin, end = e["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        values = struct.unpack(f"<{len(raw) // 4}f", raw) if e["dtype"] == "F32" else None
        tensors[key] = (e["dtype"], e["shape"], values)
    return tensors, meta


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for key, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def check(folder, expected):
    problems = []
    with open(os.path.join(folder, "adapter_config.json")) as f:
        config = json.load(f)
    for key in PEFT_CONFIG_KEYS:
        if key not in config:
            problems.append(f"adapter_config.json lacks {key}")
    for key, value in expected["config"].items():
        if config.get(key) != value:
            problems.append(f"adapter_config.json {key}: {config.get(key)!r}, expected {value!r}")
    tensors, _ = read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    if sorted(tensors) != sorted(expected["shapes"]):
        problems.append(f"keys {sorted(tensors)}, expected {sorted(expected['shapes'])}")
    for key, (dtype, shape, _) in tensors.items():
        if dtype != "F32" or shape != expected["shapes"].get(key):
            problems.append(f"{key}: {dtype}{shape}, expected F32{expected['shapes'].get(key)}")
    for p in problems:
        print(p)
    return 1 if problems else 0


def write(folder, n_embd, r, bad):
    os.makedirs(folder, exist_ok=True)
    path = PREFIX + "transformer.h.0.attn.c_attn."
    a = [0.01 * (i % 17 - 8.5) for i in range(r * n_embd)]
    b_cols = r + 1 if bad else r
    b = [0.02 * (i % 13 - 6.5) for i in range(3 * n_embd * b_cols)]
    write_safetensors(os.path.join(folder, "adapter_model.safetensors"),
                      {path + "lora_A.weight": ([r, n_embd], a), path + "lora_B.weight": ([3 * n_embd, b_cols], b)})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 16, "lora_dropout": 0.0,
              "target_modules": ["c_attn"], "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
              "init_lora_weights": True, "inference_mode": True, "base_model_name_or_path": "base"}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return 0


def main():
    if sys.argv[1] == "check":
        return check(sys.argv[2], json.loads(sys.argv[3]))
    return write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), len(sys.argv) > 5 and sys.argv[5] == "bad")


if __name__ == "__main__":
    sys.exit(main())
