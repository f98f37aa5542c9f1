#!/usr/bin/env bash
# The default language-model job (castor train --model gpt: nanoGPT's CPU recipe on Brown characters, 2000 steps)
# against its PyTorch twin (bench/nanogpt_job_torch.py) at O1 bf16 and O0, alternating: training seconds, their
# ratio (issue #20's target: Castor <= 0.6x PyTorch's wall time at O1) and both validation losses. Castor runs
# as it starts (bounded spin) and with OMP_WAIT_POLICY=passive; its faster run counts.
#   [LEVELS="O1 O0"] bench/default_job_vs_torch.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
steps=${2:-2000}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); ISA $(grep -o -m1 avx512_bf16 /proc/cpuinfo || echo avx2)"
tc=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
for level in ${LEVELS:-O1 O0}; do
  for r in $(seq "$rounds"); do
    # Castor as it starts (its bounded spin, tools/castor.cpp) and under OMP_WAIT_POLICY=passive, the faster
    # counting, as the twin's policy is PyTorch's faster one.
    castor=""
    for policy in "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT" "env OMP_WAIT_POLICY=passive"; do
      out=$(mktemp -d)
      json=$($policy ./build/castor train --model gpt --amp "$level" --steps "$steps" --out "$out/run" 2>/dev/null)
      rm -rf "$out"
      # training seconds = tokens / tokens-per-second (the evaluation is left out, as in the twin's figure)
      run=$(python3 -c "import json,sys; j=json.loads(sys.argv[1]); print(f\"{$steps*12*64/j['train_tokens_per_sec']:.2f} {j['val_loss']:.4f}\")" "$json")
      echo "$level round $r castor (${policy#env }): train ${run% *} s, val ${run#* }" >&2
      if [ -z "$castor" ] || python3 -c "import sys; sys.exit(not float('${run% *}') < float('${castor% *}'))"; then castor=$run; fi
    done
    policy=""; [ "$level" = O0 ] && policy="OMP_WAIT_POLICY=passive"
    torch=$(env $policy LD_PRELOAD="$tc" /usr/bin/python3 bench/nanogpt_job_torch.py data/brown-char "$level" "$steps" | cut -d' ' -f4-)
    python3 -c "
c, cv = map(float, '$castor'.split()); t, tv = map(float, '$torch'.split())
print(f'$level round $r: castor {c:.1f} s (val {cv:.4f})  pytorch {t:.1f} s (val {tv:.4f})  castor/pytorch time {c/t:.2f}x')"
  done
done
