# PyTorch 1.13 LoRA on gpt_oracle.py's GPT, llama_oracle.py's Transformer or hf_llama_oracle.py's Hugging Face
# Llama/Qwen2, for tests/nn/lora_test.cpp and tests/formats/hf_test.cpp.
#
#   lora_oracle.py grads CONFIG WEIGHTS BATCH OUT
#       WEIGHTS: the base's nanoGPT-named tensors and the adapters' "<path>.lora_A.weight" (r, in) and
#       "<path>.lora_B.weight" (out, r). Wraps each adapted Linear, freezes the base, runs BATCH's "x", "y" forward
#       and backward and writes OUT: "loss", "logits", "grad.<path>.lora_A.weight", ... for the adapters, and
#       "base_grads" (int64 [1]: how many base parameters got a gradient).
#   lora_oracle.py train CONFIG WEIGHTS BATCH OUT
#       PEFT's training of the adapters: torch.optim.AdamW over the adapters only (lr, betas, eps, weight_decay of
#       CONFIG, as a PEFT user passes model.parameters() with the base frozen), CONFIG["steps"] steps on BATCH's
#       "x.<i>", "y.<i>". Dropout on each adapter's input uses Castor's masks, BATCH's "mask.<i>.<path>" (the input's
#       shape, each 0 or 1 / (1 - p)), in the order the forward reaches the layers, so that both sides drop the same
#       elements. Writes OUT "loss" (float64 [steps]: step i's loss before its update) and "<i>.<path>.lora_A.weight",
#       "<i>.<path>.lora_B.weight" (the adapters after step i).
#   lora_oracle.py peft HF_DIR PEFT_DIR BATCH OUT
#       What a PEFT user gets from Castor's export: the Hugging Face model of HF_DIR (hf_llama_oracle.py) with PEFT_DIR's
#       adapters (adapter_config.json's r, lora_alpha, use_rslora, target_modules; adapter_model.safetensors under
#       "base_model.model." + Hugging Face names) merged as PEFT's merge_and_unload does, W += scaling * B @ A, each
#       module's r and lora_alpha from rank_pattern and alpha_pattern as PEFT's LoraModel._create_and_replace takes
#       them (get_pattern_key: the first key, in the file's order, that re.match(rf"(.*\.)?({key})$") finds in the
#       module's name). Writes OUT "logits" of BATCH's "x" and "ranks" (each adapted module's r, in name order); exits
#       1 naming an adapter whose module target_modules does not name, or whose tensors are not of its r.
# CONFIG: gpt_oracle.py's fields (llama_oracle.py's with "model": "llama"; "model": "hf" and "dir": the base is that
# Hugging Face directory as hf_llama_oracle.py reads it, WEIGHTS the adapters alone, under Hugging Face's names) and
# "scaling"; "autocast": "bf16" stores the frozen base's non-LayerNorm parameters in bfloat16 and runs under
# torch.autocast("cpu", torch.bfloat16), as Castor's O1 with LoRA (LayerNorm as Castor's: float32 statistics and
# parameters, the output in the input's dtype).
import json
import math
import os
import re
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_oracle import GPT  # noqa: E402
from hf_llama_oracle import load as load_hf  # noqa: E402
from llama_oracle import Transformer  # noqa: E402
from safetensors_io import read, write  # noqa: E402


class LoraLinear(nn.Module):
    """PEFT's lora.Linear: base(x) + lora_B(lora_A(dropout(x))) * scaling."""

    def __init__(self, base, r, scaling):
        super().__init__()
        self.base, self.scaling = base, scaling
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.mask = None  # the dropout mask of this forward (train mode), or none

    def forward(self, x):
        dropped = x if self.mask is None else x * self.mask
        return self.base(x) + self.lora_B(self.lora_A(dropped)) * self.scaling


def pattern_key(keys, name):
    """peft.utils.other.get_pattern_key: the first key whose regular expression ends the module's name."""
    for key in keys:
        if re.match(rf"(.*\.)?({key})$", name):
            return key
    return name


def peft(hf_dir, peft_dir, batch, out):
    with open(f"{peft_dir}/adapter_config.json") as f:
        config = json.load(f)  # (a dict in the file's order)
    targets = set(config["target_modules"])
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    state, _, _, _ = read(f"{peft_dir}/adapter_model.safetensors")
    model = load_hf(hf_dir)
    params = dict(model.named_parameters())
    paths = sorted({k[:k.index(".lora_")] for k in state})
    ranks = []
    for path in paths:
        assert path.startswith("base_model.model."), path
        module = path[len("base_model.model."):]
        if module.rsplit(".", 1)[-1] not in targets:
            sys.exit(f"{module}: not in target_modules {sorted(targets)}")
        r = rank_pattern.get(pattern_key(rank_pattern.keys(), module), config["r"])
        alpha = alpha_pattern.get(pattern_key(alpha_pattern.keys(), module), config["lora_alpha"])
        scaling = alpha / math.sqrt(r) if config.get("use_rslora", False) else alpha / r
        a, b = state[path + ".lora_A.weight"].double(), state[path + ".lora_B.weight"].double()
        if a.shape[0] != r or b.shape[1] != r:
            sys.exit(f"{module}: adapters of rank {a.shape[0]}, but its r is {r}")
        ranks.append(r)
        w = params[module + ".weight"]
        with torch.no_grad():
            w.copy_((w.double() + scaling * (b @ a)).float())
    with torch.no_grad():
        logits, _ = model(read(batch)[0]["x"])
    write(out, {"logits": logits.float().contiguous(), "adapted": torch.tensor([len(paths)]),
                "ranks": torch.tensor(ranks)}, {})


def main():
    if sys.argv[1] == "peft":
        return peft(*sys.argv[2:6])
    mode, cfg, weights, batch, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    assert mode in ("grads", "train")
    torch.set_num_threads(2)
    state, _, _, _ = read(weights)
    if cfg.get("model") == "hf":
        model = load_hf(cfg["dir"])
    else:
        model = (Transformer if cfg.get("model") == "llama" else GPT)(cfg)
        model.load_state_dict({k: v.float() for k, v in state.items() if ".lora_" not in k}, strict=True)
    model.requires_grad_(False)
    autocast = cfg.get("autocast") == "bf16"
    if autocast:
        # Castor's layer_norm takes a 16-bit input (the embeddings are bfloat16 now) with float32 statistics and
        # parameters, and gives the input's dtype; PyTorch 1.13's CPU layer_norm wants one dtype.
        nn.LayerNorm.forward = lambda ln, x: F.layer_norm(x.float(), ln.normalized_shape, ln.weight, ln.bias,
                                                          ln.eps).to(x.dtype)
        for m in model.modules():
            if not isinstance(m, nn.LayerNorm):
                for p in m.parameters(recurse=False):
                    p.data = p.data.bfloat16()
    adapters = {}
    for path in sorted({k[:k.index(".lora_")] for k in state if ".lora_" in k}):
        parent_path, name = path.rsplit(".", 1) if "." in path else ("", path)
        parent = model.get_submodule(parent_path)
        r = state[path + ".lora_A.weight"].shape[0]
        wrapped = LoraLinear(getattr(parent, name), r, cfg["scaling"])
        wrapped.lora_A.weight.data = state[path + ".lora_A.weight"].float().clone()
        wrapped.lora_B.weight.data = state[path + ".lora_B.weight"].float().clone()
        setattr(parent, name, wrapped)
        adapters[path] = wrapped
    tensors, _, _, _ = read(batch)
    if mode == "train":
        return train(cfg, model, adapters, tensors, out)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits, loss = model(tensors["x"], tensors["y"])
    loss.backward()
    result = {"loss": loss.detach().float().reshape(1), "logits": logits.detach().float().contiguous()}
    for path, m in adapters.items():
        result[f"grad.{path}.lora_A.weight"] = m.lora_A.weight.grad.contiguous()
        result[f"grad.{path}.lora_B.weight"] = m.lora_B.weight.grad.contiguous()
    base = [p for n, p in model.named_parameters() if ".lora_" not in n]
    result["base_grads"] = torch.tensor([sum(p.grad is not None for p in base)], dtype=torch.int64)
    write(out, result, {})


def train(cfg, model, adapters, tensors, out):
    params = [p for m in adapters.values() for p in (m.lora_A.weight, m.lora_B.weight)]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            weight_decay=cfg["weight_decay"])
    losses, result = [], {}
    for i in range(cfg["steps"]):
        for path, m in adapters.items():
            m.mask = tensors.get(f"mask.{i}.{path}")
        _, loss = model(tensors[f"x.{i}"], tensors[f"y.{i}"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        for path, m in adapters.items():
            result[f"{i}.{path}.lora_A.weight"] = m.lora_A.weight.detach().clone()
            result[f"{i}.{path}.lora_B.weight"] = m.lora_B.weight.detach().clone()
    result["loss"] = torch.tensor(losses, dtype=torch.float64)
    write(out, result, {})


if __name__ == "__main__":
    main()
