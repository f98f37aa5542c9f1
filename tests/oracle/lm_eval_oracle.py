# The validation loss of a GPT over the real vocabulary, as llm.c's and nanoGPT's evaluations compute it, for
# tests/train/llmc_test.cpp (the real vocabulary of token folders without Castor's metadata).
#
#   lm_eval_oracle.py CONFIG WEIGHTS TOKENS OUT
#       loads WEIGHTS (safetensors with nanoGPT names; transformer.wte.weight may hold padding rows past the real
#       vocabulary, as llm.c's Vp: only its first vocab_size rows are tokens) into tests/oracle/gpt_oracle.py's GPT,
#       reads TOKENS (an llm.c token file) and writes OUT "loss" (float64 [1]): the mean cross-entropy of every window
#       of seq_len tokens (row k: tokens k T .. k T + T, predicting the next), in float32.
# CONFIG is a JSON object: n_layer, n_head, n_embd, block_size, vocab_size (the real vocabulary), bias, seq_len.
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_oracle import GPT  # noqa: E402
from safetensors_io import read, write  # noqa: E402


def main():
    c, weights, tokens, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    model = GPT(c)
    state, _, _, _ = read(weights)
    state = {k: v.float() for k, v in state.items() if k != "lm_head.weight"}  # tied to wte
    state["transformer.wte.weight"] = state["transformer.wte.weight"][: c["vocab_size"]]
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    with open(tokens, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        data = torch.from_numpy(np.frombuffer(f.read(), dtype="<u2")[: header[2]].astype(np.int64))
    T = c["seq_len"]
    rows = (data.numel() - 1) // T
    x = torch.stack([data[k * T: k * T + T] for k in range(rows)])
    y = torch.stack([data[k * T + 1: k * T + T + 1] for k in range(rows)])
    with torch.no_grad():
        _, loss = model(x, y)
    write(out, {"loss": torch.tensor([loss.item()], dtype=torch.float64)}, {})


if __name__ == "__main__":
    main()
