# llm.c interop oracle: a random nanoGPT twin (tests/oracle/gpt_oracle.py's GPT, GPT-2 init) written in llm.c's
# checkpoint format, a token file in llm.c's format, and the twin's losses over AdamW steps on llm.c-order batches,
# for tests/train/llmc_test.cpp (small config) and bench/llmc_interop.sh (GPT-2 124M).
#
#   llmc_oracle.py CONFIG DIR
#       writes DIR/model.bin (header {20240326, 3, maxT, V, L, NH, C, Vp}, wte padded to Vp rows with zeros, as
#       llm.c's train_gpt2.py writes it), DIR/train.bin (steps * B * T + 1 tokens) and DIR/losses.safetensors:
#       "loss" (float64 [steps]): the loss of batch i before step i's update, AdamW (decay on dim >= 2 only, no
#       clipping) in float32; "loss_untrained" (float64 [steps]): batch i's loss under the initial weights;
#       "seconds" (float64 [1]): the training steps' time.
# CONFIG is a JSON object: n_layer, n_head, n_embd, block_size (maxT), vocab_size (V), padded_vocab_size (Vp),
# batch_size, seq_len, steps, lr, weight_decay, seed.
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_oracle import GPT  # noqa: E402
from safetensors_io import write  # noqa: E402


def gpt2_init(model, n_layer):
    for name, p in model.named_parameters():
        if ".ln_" in name:
            continue
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        else:
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
            torch.nn.init.normal_(p, 0.0, std)


def write_llmc_model(path, model, c):
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, c["block_size"], c["vocab_size"], c["n_layer"], c["n_head"], c["n_embd"],
                  c["padded_vocab_size"]]
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    wte = sd["transformer.wte.weight"]
    padded = torch.zeros(c["padded_vocab_size"], wte.size(1))
    padded[: wte.size(0)] = wte
    order = [padded, sd["transformer.wpe.weight"]]
    for suffix in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                   "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                   "mlp.c_proj.weight", "mlp.c_proj.bias"]:
        order.append(torch.stack([sd[f"transformer.h.{i}.{suffix}"] for i in range(c["n_layer"])]))
    order += [sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in order:
            f.write(t.contiguous().numpy().astype("<f4").tobytes())


def main():
    c, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(2)
    torch.manual_seed(c["seed"])
    cfg = dict(c, bias=True)
    model = GPT(cfg)
    gpt2_init(model, c["n_layer"])
    write_llmc_model(os.path.join(out, "model.bin"), model, c)

    # A learnable stream: token i+1 = (7 * token i + 3) mod V, with a random token one time in four.
    B, T, steps, V = c["batch_size"], c["seq_len"], c["steps"], c["vocab_size"]
    n = steps * B * T + 1
    g = torch.Generator().manual_seed(c["seed"] + 1)
    noise = torch.randint(0, V, (n,), generator=g)
    coin = torch.rand(n, generator=g) < 0.25
    tokens = [int(noise[0])]
    for i in range(1, n):
        tokens.append(int(noise[i]) if coin[i] else (7 * tokens[-1] + 3) % V)
    with open(os.path.join(out, "train.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(np.array(tokens, dtype="<u2").tobytes())
    data = torch.tensor(tokens, dtype=torch.int64)

    def batch(i):  # llm.c's loader order
        buf = data[i * B * T: i * B * T + B * T + 1]
        return buf[:-1].view(B, T), buf[1:].view(B, T)

    with torch.no_grad():
        untrained = [model(*batch(i))[1].item() for i in range(steps)]
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": c["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"], betas=(0.9, 0.999), eps=1e-8)
    losses = []
    t0 = time.perf_counter()
    for i in range(steps):
        _, loss = model(*batch(i))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    write(os.path.join(out, "losses.safetensors"),
          {"loss": torch.tensor(losses, dtype=torch.float64),
           "loss_untrained": torch.tensor(untrained, dtype=torch.float64),
           "seconds": torch.tensor([seconds], dtype=torch.float64)}, {})


if __name__ == "__main__":
    main()
