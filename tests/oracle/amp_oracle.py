# PyTorch 1.13 CPU autocast cases for the AMP tests.
#
#   amp_oracle.py batch_norm OUT
#       batch_norm under torch.autocast("cpu", bfloat16) of x = bfloat16(3 sin(0.7 i) + 0.5), i = 0..95, shaped
#       (2, 3, 4, 4), with weight 1.5, bias -0.25, running mean 0 and var 1; in training then in eval mode.
#       Writes one line per mode: the output dtype, then the 96 outputs as float32.
import sys

import numpy as np
import torch


def main():
    cmd, out = sys.argv[1], sys.argv[2]
    assert cmd == "batch_norm", cmd
    i = np.arange(96, dtype=np.float32)
    x = torch.from_numpy(np.sin(np.float32(0.7) * i) * np.float32(3.0) + np.float32(0.5))
    x = x.reshape(2, 3, 4, 4).to(torch.bfloat16)
    lines = []
    for training in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.batch_norm(x, torch.zeros(3), torch.ones(3), torch.full((3,), 1.5),
                                               torch.full((3,), -0.25), training=training)
        lines.append(" ".join([str(y.dtype).replace("torch.", "")] + [repr(float(v)) for v in y.float().flatten()]))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
