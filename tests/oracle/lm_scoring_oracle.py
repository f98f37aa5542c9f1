# Log-likelihood scoring as lm-evaluation-harness's Hugging Face backend computes it (_loglikelihood_tokens: the input
# (context + continuation)[-(max_length + 1):][:-1], log_softmax of the logits, the continuation's positions summed;
# acc and acc_norm of lm_eval/api/task.py's process_results), llm.c's dev/data/hellaswag.py token-mean rule, and
# llama.cpp's llama-perplexity chunks, on PyTorch 1.13 with the GPT of gpt_oracle.py or the Hugging Face Llama of
# hf_llama_oracle.py, for tests/train/lm_scoring_test.cpp.
#
#   lm_scoring_oracle.py hf DIR CASE OUT          a Hugging Face directory (hf_llama_oracle.py's model, float32)
#   lm_scoring_oracle.py gpt CONFIG WEIGHTS CASE OUT   gpt_oracle.py's GPT, WEIGHTS with nanoGPT names
# CASE (JSON): block_size; requests [{context: [ids], continuation: [ids]}]; docs [{requests: [indices], gold,
# chars: [each choice's length in characters]}]; perplexity {tokens, ctx, bos (-1: none)}.
# OUT (JSON): loglik [per request]; acc, acc_norm, acc_norm_tokens [per doc, 0/1; acc_norm_tokens null for a doc whose
# rows do not fit the block]; perplexity {nll, tokens}.
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read  # noqa: E402


def load_model():
    if sys.argv[1] == "hf":
        from hf_llama_oracle import load
        return load(sys.argv[2]), sys.argv[3], sys.argv[4]
    from gpt_oracle import GPT
    cfg = json.loads(sys.argv[2])
    model = GPT(cfg)
    state = {k: v.float() for k, v in read(sys.argv[3])[0].items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    return model, sys.argv[4], sys.argv[5]


def logits_of(model, ids):
    """float32 logits (B, T, V) of a (B, T) batch."""
    out, _ = model(torch.tensor(ids, dtype=torch.long))
    return out.float()


def loglikelihood(model, context, continuation, max_length):
    """lm-eval's _loglikelihood_tokens for one request (batch of one, no padding)."""
    inp = (context + continuation)[-(max_length + 1):][:-1]
    logits = F.log_softmax(logits_of(model, [inp]), dim=-1)[0]  # (T, V)
    n = len(continuation)
    picked = logits[len(inp) - n:].gather(1, torch.tensor(continuation)[:, None])
    return float(picked.sum())


def hellaswag_pred_norm(model, rows):
    """llm.c's hellaswag.py evaluate(): rows (context, ending tokens) padded, masked per-token cross-entropy, the
    argmin of the mean loss over the ending's tokens."""
    width = max(len(c) + len(e) for c, e in rows)
    tokens = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (c, e) in enumerate(rows):
        tokens[i, : len(c) + len(e)] = torch.tensor(c + e)
        mask[i, len(c): len(c) + len(e)] = 1
    logits = logits_of(model, tokens.tolist())
    shift_logits = logits[..., :-1, :].contiguous()
    shift_tokens = tokens[..., 1:].contiguous()
    losses = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_tokens.view(-1), reduction="none")
    losses = losses.view(tokens.size(0), -1)
    shift_mask = mask[..., 1:].contiguous()
    avg_loss = (losses * shift_mask).sum(dim=1) / shift_mask.sum(dim=1)
    return int(avg_loss.argmin().item())


def perplexity(model, p):
    """llama-perplexity: chunks of ctx tokens, the first set to BOS, scored on positions ctx/2 .. ctx-2."""
    tokens, ctx, bos = p["tokens"], p["ctx"], p["bos"]
    first, nll, count = ctx // 2, 0.0, 0
    for c in range(len(tokens) // ctx):
        chunk = tokens[c * ctx: (c + 1) * ctx]
        if bos >= 0:
            chunk[0] = bos
        logp = F.log_softmax(logits_of(model, [chunk])[0].double(), dim=-1)
        for i in range(first, ctx - 1):
            nll -= float(logp[i, chunk[i + 1]])
            count += 1
    return {"nll": nll / count, "tokens": count}


def main():
    torch.set_num_threads(2)
    model, case_path, out_path = load_model()
    model.eval()
    with open(case_path) as f:
        case = json.load(f)
    T = case["block_size"]
    out = {"acc": [], "acc_norm": [], "acc_norm_tokens": []}
    with torch.no_grad():
        out["loglik"] = [loglikelihood(model, r["context"], r["continuation"], T) for r in case["requests"]]
        for d in case["docs"]:
            lls = torch.tensor([out["loglik"][i] for i in d["requests"]], dtype=torch.float64)
            chars = torch.tensor(d["chars"], dtype=torch.float64)
            out["acc"].append(int(int(torch.argmax(lls)) == d["gold"]))
            out["acc_norm"].append(int(int(torch.argmax(lls / chars)) == d["gold"]))
            rows = [(case["requests"][i]["context"], case["requests"][i]["continuation"]) for i in d["requests"]]
            fits = all(len(c) + len(e) <= T for c, e in rows)
            out["acc_norm_tokens"].append(int(hellaswag_pred_norm(model, rows) == d["gold"]) if fits else None)
        out["perplexity"] = perplexity(model, case["perplexity"])
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
