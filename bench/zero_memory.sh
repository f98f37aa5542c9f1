#!/usr/bin/env bash
# Issue #48's memory and speed table: per-rank allocator peak of ZeRO full fine-tuning (AdamW8bit, O1 bf16, --recompute
# blocks) at 1 rank, 2 ranks --zero 2 and 4 ranks --zero 3 (one thread each), with the --dry-run plan beside each, and
# the throughput of --zero 2 against replicated data parallelism at 2 ranks. The peak is rank 0's (it holds the largest
# slices) as castor reports it in metrics.jsonl after the last training step (the allocator's statistics, independent
# of the machine's load; the final evaluation and checkpoint, which make the weights whole, come after it). Data:
# character tokens of a generated text (the ids fit any vocabulary).
#
#   bench/zero_memory.sh [SHAPE=tinyllama|medium|small] [CASTOR=./build/castor]   (from the repository root)
#   env: SEQ (512) tokens a row, STEPS (2) steps per memory run, TSTEPS (6) steps per throughput run, CONFIGS
#        ("1:0 2:2 4:3") the nproc:zero runs, TIMING (auto: only when the load average is below 3; 1: always; 0: never)
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
common() { echo --model llama $model --block-size "$seq" --data tokens --data-dir tok --amp O1 --dtype bf16 \
  --optimizer adamw8bit --recompute blocks --batch-size 1 --threads 1 --eval-every 0 --log-every 1 \
  --checkpoint-minutes 0; }
gib() { /usr/bin/python3 -c "print(f'{$1 / 2**30:.2f}')"; }
base=""
printf "| ranks | --zero | plan GiB | peak GiB (rank 0) | peak / 1-rank peak |\n|---:|---:|---:|---:|---:|\n"
for cfg in ${CONFIGS:-1:0 2:2 4:3}; do
  n=${cfg%:*} z=${cfg#*:}
  # shellcheck disable=SC2046
  plan=$("$bin" train $(common) --nproc "$n" --zero "$z" --dry-run --out plan 2>/dev/null | tail -1 |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['stages'][$z]['total_bytes'])")
  # shellcheck disable=SC2046
  "$bin" train $(common) --nproc "$n" --zero "$z" --steps "${STEPS:-2}" --out "r$n$z" >/dev/null 2>"r$n$z.err" ||
    { echo "| $n | $z | $(gib "$plan") | failed: $(tail -1 "r$n$z.err") | |"; continue; }
  peak=$(/usr/bin/python3 -c "
import json
rows = [json.loads(l) for l in open('r$n$z/metrics.jsonl')]
print([r for r in rows if 'loss' in r and 'train_loss' not in r][-1]['peak_memory_bytes'])")
  [ -n "$base" ] || base=$peak
  echo "| $n | $z | $(gib "$plan") | $(gib "$peak") | $(/usr/bin/python3 -c "print(f'{$peak / $base:.2f}x')") |"
done
timing=${TIMING:-auto}
if [ "$timing" = auto ]; then
  timing=$(/usr/bin/python3 -c "print(1 if $(load) < 3 else 0)")
  [ "$timing" = 1 ] || echo "# throughput not measured: load average $(load) (>= 3; TIMING=1 measures anyway)"
fi
if [ "$timing" = 1 ]; then
  for z in 0 2 0 2; do
    # shellcheck disable=SC2046
    rate=$("$bin" train $(common) --nproc 2 --zero "$z" --steps "${TSTEPS:-6}" --out "t$z" --overwrite 2>/dev/null |
      sed -n 's/.*"train_tokens_per_sec":\([0-9.]*\).*/\1/p')
    echo "throughput 2 ranks --zero $z: $rate tokens/s (load $(load))"
  done
fi
