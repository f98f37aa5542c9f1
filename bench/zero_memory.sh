#!/usr/bin/env bash
# Issue #48's memory and speed table: per-rank allocator peak and tokens/s of ZeRO full fine-tuning (AdamW8bit, bf16,
# --recompute blocks) at 1 rank, 2 ranks --zero 2 and 4 ranks --zero 3 (one thread each), at O1 (float32 weights) and
# O2 (bf16 weights, float32 masters), with the --dry-run plan beside each, and the throughput of --zero 2 against
# replicated data parallelism at 2 ranks. The peak is rank 0's (it holds the largest slices) as castor reports it in
# metrics.jsonl after the last training step (the allocator's statistics, independent of the machine's load); the run
# is stopped there (SIGKILL to its process group: the final evaluation and checkpoint are not part of a step). Data:
# character tokens of a generated text (the ids fit any vocabulary).
#
#   bench/zero_memory.sh [SHAPE=tinyllama|medium|small] [CASTOR=./build/castor]   (from the repository root)
#   env: SEQ (512) tokens a row, STEPS (2) steps per memory run, TSTEPS (6) steps per throughput run, CONFIGS
#        ("1:0:O1 2:2:O1 4:3:O1 1:0:O2 2:2:O2") the nproc:zero:opt-level runs (the ratio is to the 1-rank run of the
#        same opt level), TIMING (auto: only when the load average is below 3; 1: always; 0: never), ROUNDS (2)
#        alternating throughput rounds
set -euo pipefail
shape=${1:-tinyllama}
bin=${2:-./build/castor}
case $shape in
  tinyllama) model="--n-layer 22 --n-embd 2048 --n-head 32 --n-kv-head 4 --multiple-of 5632 --untied --vocab-size 32000" ;;
  medium) model="--n-layer 8 --n-embd 1024 --n-head 16 --n-kv-head 4 --multiple-of 2816 --untied --vocab-size 32000" ;;
  small) model="--n-layer 4 --n-embd 512 --n-head 8 --n-kv-head 4 --multiple-of 1408 --untied --vocab-size 32000" ;;
  *) echo "zero_memory.sh: unknown shape '$shape' (tinyllama, medium, small)" >&2; exit 2 ;;
esac
[ -x "$bin" ] || { echo "zero_memory.sh: $bin is not built (cmake --build build --target castor_cli)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
seq=${SEQ:-512}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
/usr/bin/python3 -c "
import random
random.seed(1)
w = ['the jury ', 'said ', 'a letter ', 'was found. ', 'in the city ']
open('text.txt', 'w').write(''.join(random.choice(w) for _ in range(40000)))"
"$bin" tokenize --tokenizer char --input text.txt --out tok --val-fraction 0.1 >/dev/null
rm tok/castor_tokens.json  # (no tokenizer record: the model takes --vocab-size)
load() { uptime | sed 's/.*load average: *//; s/,.*//'; }
echo "# $(date -u +%Y-%m-%dT%H:%MZ), shape $shape, sequence $seq, load $(load)"
# shellcheck disable=SC2086  # the flags are words
common() { echo --model llama $model --block-size "$seq" --data tokens --data-dir tok --dtype bf16 \
  --optimizer adamw8bit --recompute blocks --batch-size 1 --threads 1 --eval-every 0 --eval-iters 1 --log-every 1 \
  --checkpoint-minutes 0; }
gib() { /usr/bin/python3 -c "print(f'{$1 / 2**30:.2f}')"; }
# The metrics row of training step $2 in run directory $1 (empty until it is written).
step_row() { [ -f "$1/metrics.jsonl" ] && /usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$1/metrics.jsonl') if l.strip()]
rows = [r for r in rows if 'loss' in r and 'train_loss' not in r and r['step'] == $2]
print(f\"{rows[0]['peak_memory_bytes']} {rows[0]['tokens_per_sec']:.2f}\" if rows else '')"; }
# Trains run $1 for $2 steps (the rest of the arguments: its flags) and stops it after the last step's metrics row;
# prints that row's peak bytes and tokens/s, or nothing when the run ended without it.
run_steps() {
  local out=$1 steps=$2 row=""
  shift 2
  rm -rf "$out"  # (an earlier round's metrics would be read as this one's)
  # shellcheck disable=SC2046
  setsid "$bin" train $(common) "$@" --steps "$steps" --out "$out" >/dev/null 2>"$out.err" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    row=$(step_row "$out" "$steps")
    [ -z "$row" ] || break
    sleep 2
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ -n "$row" ] || row=$(step_row "$out" "$steps")
  echo "$row"
}
declare -A base
printf "| ranks | --zero | --amp | plan GiB | peak GiB (rank 0) | peak / 1-rank peak | tokens/s (all ranks) |\n"
printf "|---:|---:|---|---:|---:|---:|---:|\n"
for cfg in ${CONFIGS:-1:0:O1 2:2:O1 4:3:O1 1:0:O2 2:2:O2}; do
  IFS=: read -r n z amp <<<"$cfg"
  amp=${amp:-O1}
  # shellcheck disable=SC2046
  plan=$("$bin" train $(common) --amp "$amp" --nproc "$n" --zero "$z" --dry-run --out plan 2>/dev/null | tail -1 |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['stages'][$z]['total_bytes'])")
  row=$(run_steps "r$n$z$amp" "${STEPS:-2}" --amp "$amp" --nproc "$n" --zero "$z")
  if [ -z "$row" ]; then
    echo "| $n | $z | $amp | $(gib "$plan") | failed: $(tail -1 "r$n$z$amp.err") | | |"
    continue
  fi
  read -r peak rate <<<"$row"
  [ -n "${base[$amp]:-}" ] || base[$amp]=$peak
  echo "| $n | $z | $amp | $(gib "$plan") | $(gib "$peak") | $(/usr/bin/python3 -c "print(f'{$peak / ${base[$amp]}:.2f}x')") | $rate |"
done
timing=${TIMING:-auto}
if [ "$timing" = auto ]; then
  timing=$(/usr/bin/python3 -c "print(1 if $(load) < 3 else 0)")
  [ "$timing" = 1 ] || echo "# throughput not measured: load average $(load) (>= 3; TIMING=1 measures anyway)"
fi
if [ "$timing" = 1 ]; then
  for _ in $(seq "${ROUNDS:-2}"); do
    for z in 0 2; do
      row=$(run_steps "t$z" "${TSTEPS:-6}" --amp O1 --nproc 2 --zero "$z")
      echo "throughput 2 ranks --zero $z (O1): ${row#* } tokens/s (load $(load))"
    done
  done
fi
