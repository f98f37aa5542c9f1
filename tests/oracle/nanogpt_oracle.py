# nanoGPT's sampling and checkpoint, written from its published model.py / sample.py / train.py for
# tests/train/sample_cli_test.cpp, on gpt_oracle.py's GPT (nanoGPT's architecture and names).
#
#   nanogpt_oracle.py generate CONFIG WEIGHTS PROMPT N OUT
#       loads WEIGHTS (safetensors, nanoGPT names) into a GPT of CONFIG (JSON: n_layer, n_head, n_embd, block_size,
#       vocab_size, bias) and runs nanoGPT's GPT.generate greedily (top_k 1) in float32 for N tokens after PROMPT
#       (comma-separated ids); OUT (safetensors): "tokens" (int64), the prompt and the new tokens.
#   nanogpt_oracle.py ckpt CKPT PROMPT N OUT
#       torch.load(CKPT) as sample.py does, and again with weights_only=True; the GPT from checkpoint['model_args'],
#       checkpoint['model'] loaded strictly, then the same greedy generate. With an "optimizer" entry, train.py's
#       resume: AdamW from configure_optimizers' groups loads it and takes a step. OUT: "tokens", "iter_num",
#       "best_val_loss", "model_args.<key>", "optimizer_groups" (lr, beta1, beta2, eps, weight decay of the first
#       group, weight decay of the second), "optimizer_step", "optimizer_exp_avg_sq0" (the first parameter's first
#       8 values); the checkpoint's structure is checked by assertions here.
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_oracle import GPT  # noqa: E402
from safetensors_io import read, write  # noqa: E402


@torch.no_grad()
def generate(model, idx, max_new_tokens, block_size, temperature=1.0, top_k=1):
    """nanoGPT's GPT.generate: crop to the last block_size tokens every step, last position, top-k, multinomial."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def main():
    torch.set_num_threads(2)
    torch.manual_seed(1337)
    mode = sys.argv[1]
    if mode == "generate":
        cfg, weights, prompt, n, out = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
        model = GPT(cfg)
        state, _, _, _ = read(weights)
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        result = {}
    else:
        ckpt_path, prompt, n, out = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        checkpoint = torch.load(ckpt_path, map_location="cpu")
        safe = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        assert safe.keys() == checkpoint.keys(), (safe.keys(), checkpoint.keys())
        for k in ["model", "model_args", "iter_num", "best_val_loss", "config"]:
            assert k in checkpoint, k
        args = checkpoint["model_args"]
        for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"]:
            assert k in args, k
        cfg = dict(args)
        model = GPT(cfg)
        state_dict = checkpoint["model"]
        unwanted_prefix = "_orig_mod."
        for k in list(state_dict.keys()):
            if k.startswith(unwanted_prefix):
                state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
        # nanoGPT's attention under PyTorch < 2 registers its causal mask as the buffer attn.bias (1, 1, T, T);
        # gpt_oracle's keeps it unsaved.
        t = args["block_size"]
        for i in range(args["n_layer"]):
            mask = state_dict.pop(f"transformer.h.{i}.attn.bias")
            assert torch.equal(mask, torch.tril(torch.ones(t, t)).view(1, 1, t, t))
        assert state_dict["lm_head.weight"].data_ptr() == state_dict["transformer.wte.weight"].data_ptr()
        model.load_state_dict(state_dict, strict=True)
        assert isinstance(checkpoint["config"], dict) and isinstance(checkpoint["iter_num"], int)
        result = {"iter_num": torch.tensor([checkpoint["iter_num"]], dtype=torch.int64),
                  "best_val_loss": torch.tensor([float(checkpoint["best_val_loss"])], dtype=torch.float64)}
        for k in ["n_layer", "n_head", "n_embd", "block_size", "vocab_size"]:
            result["model_args." + k] = torch.tensor([args[k]], dtype=torch.int64)
        if "optimizer" in checkpoint:
            # train.py's resume: configure_optimizers' groups (decay: dim >= 2), then load_state_dict and a step.
            params = [p for _, p in model.named_parameters()]
            groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
            opt = torch.optim.AdamW(groups, lr=1.0, betas=(0.5, 0.5))
            opt.load_state_dict(checkpoint["optimizer"])
            g = opt.param_groups[0]
            result["optimizer_groups"] = torch.tensor([g["lr"], g["betas"][0], g["betas"][1], g["eps"],
                                                       g["weight_decay"], opt.param_groups[1]["weight_decay"]],
                                                      dtype=torch.float64)
            st = opt.state[params[0]]
            result["optimizer_step"] = torch.tensor([float(st["step"])], dtype=torch.float64)
            result["optimizer_exp_avg_sq0"] = st["exp_avg_sq"].double().reshape(-1)[:8].contiguous()
            saved = [p.detach().clone() for p in params]
            x = torch.zeros(1, 4, dtype=torch.int64)
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            assert any(not torch.equal(a, p) for a, p in zip(saved, params)), "the resumed AdamW step changed nothing"
    model.eval()
    idx = torch.tensor([[int(t) for t in prompt.split(",")]], dtype=torch.int64)
    result["tokens"] = generate(model, idx, n, cfg["block_size"]).reshape(-1).contiguous()
    write(out, result, {})


if __name__ == "__main__":
    main()
