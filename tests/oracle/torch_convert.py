# PyTorch oracle for convert_test: reads raw float32 values, writes torch's float16 and bfloat16 bits of them.
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    sys.exit(f"torch_convert.py: cannot import torch/numpy with {sys.executable}: {e}")


def main(src_path, f16_path, bf16_path):
    values = torch.from_numpy(np.fromfile(src_path, dtype=np.float32))
    values.to(torch.float16).view(torch.int16).numpy().tofile(f16_path)
    values.to(torch.bfloat16).view(torch.int16).numpy().tofile(bf16_path)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: torch_convert.py IN.f32 OUT.f16 OUT.bf16")
    main(*sys.argv[1:])
