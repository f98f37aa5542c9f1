#!/usr/bin/env bash
# A default language-model job against its PyTorch twin (bench/nanogpt_job_torch.py), alternating: training seconds,
# their ratio and both validation losses (the same recipe, data files and validation rows; each side draws its own
# random training windows). --model gpt (default): castor train --model gpt, nanoGPT's CPU recipe on Brown characters,
# 2000 steps, at O1 bf16 and O0 (issue #20's target: Castor <= 0.6x PyTorch's wall time at O1). --model llama:
# castor train --model llama, the `llama` preset on data/brown-bpe, 500 steps, at O1 bf16 (issue #28's targets: wall
# time <= 0.6x and validation losses within 0.02). Castor runs as it starts (bounded spin) and with
# OMP_WAIT_POLICY=passive, PyTorch at O1 under its default policy and passive; each side's faster run counts. Each run's whole-process wall and CPU seconds (training, evaluation
# and start-up) are printed too, as the host's load moves wall times.
#   [LEVELS="O1 O0"] [POLICIES="spin passive"] [TORCH_POLICIES="default passive"] bench/default_job_vs_torch.sh [--model gpt|llama] [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt
if [ "${1:-}" = --model ]; then model=${2:?--model: expected gpt or llama}; shift 2; fi
case $model in
  gpt) data=data/brown-char block=64 default_steps=2000 default_levels="O1 O0" ;;
  llama) data=data/brown-bpe block=128 default_steps=500 default_levels=O1 ;;
  *) echo "default_job_vs_torch.sh: --model $model: expected gpt or llama" >&2; exit 1 ;;
esac
rounds=${1:-1}
steps=${2:-$default_steps}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); ISA $(grep -o -m1 avx512_bf16 /proc/cpuinfo || echo avx2); $(nproc) cores"
echo "model $model, $steps steps; $(date -u +%H:%MZ) load average$(uptime | sed 's/.*load average://')"
tc=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
exec 3>&2  # timed's lines, past the 2>/dev/null on Castor's progress
times=$(mktemp)
trap 'rm -f "$times"' EXIT
timed() {  # timed LABEL COMMAND...: runs COMMAND, then prints its wall, user+system CPU seconds and the load to stderr
  /usr/bin/time -o "$times" -f "%e %U %S" "${@:2}"
  read -r wall user sys <"$times"
  echo "  $1: process wall ${wall} s, CPU $(python3 -c "print(f'{$user + $sys:.1f}')") s; load$(uptime | sed 's/.*load average://')" >&3
}
for level in ${LEVELS:-$default_levels}; do
  for r in $(seq "$rounds"); do
    # Castor as it starts (its bounded spin, tools/castor.cpp) and under OMP_WAIT_POLICY=passive, the faster
    # counting, as the twin's policy is PyTorch's faster one.
    castor=""
    for name in ${POLICIES:-spin passive}; do
      policy="env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT"; [ "$name" = passive ] && policy="env OMP_WAIT_POLICY=passive"
      out=$(mktemp -d)
      json=$(timed "castor $name" $policy ./build/castor train --model "$model" --amp "$level" --steps "$steps" \
        --out "$out/run" 2>/dev/null)
      rm -rf "$out"
      # training seconds = tokens / tokens-per-second (the evaluation is left out, as in the twin's figure)
      run=$(python3 -c "import json,sys; j=json.loads(sys.argv[1]); print(f\"{$steps*12*$block/j['train_tokens_per_sec']:.2f} {j['val_loss']:.4f}\")" "$json")
      echo "$level round $r castor (${policy#env }): train ${run% *} s, val ${run#* }" >&2
      if [ -z "$castor" ] || python3 -c "import sys; sys.exit(not float('${run% *}') < float('${castor% *}'))"; then castor=$run; fi
    done
    # PyTorch at O1 under its default policy (GNU OpenMP's spin) and under passive, the faster counting (the spin
    # is faster on free cores, many times slower when other work shares them); at O0 under passive.
    torch=""
    for name in $([ "$level" = O0 ] && echo passive || echo ${TORCH_POLICIES:-default passive}); do
      policy="env -u OMP_WAIT_POLICY"; [ "$name" = passive ] && policy="env OMP_WAIT_POLICY=passive"
      run=$(timed "pytorch $name" $policy LD_PRELOAD="$tc" /usr/bin/python3 bench/nanogpt_job_torch.py "$data" \
        "$level" "$steps" "$model" | cut -d' ' -f4-)
      echo "$level round $r pytorch (${policy#env }): train ${run% *} s, val ${run#* }" >&2
      if [ -z "$torch" ] || python3 -c "import sys; sys.exit(not float('${run% *}') < float('${torch% *}'))"; then torch=$run; fi
    done
    python3 -c "
c, cv = map(float, '$castor'.split()); t, tv = map(float, '$torch'.split())
print(f'$level round $r: castor {c:.1f} s (val {cv:.4f})  pytorch {t:.1f} s (val {tv:.4f})  '
      f'castor/pytorch time {c/t:.2f}x  val difference {cv - tv:+.4f}')"
  done
done
echo "end $(date -u +%H:%MZ) load average$(uptime | sed 's/.*load average://')"
