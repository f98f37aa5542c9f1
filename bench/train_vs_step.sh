#!/usr/bin/env bash
# Issue #49 §5: `castor train` as a user runs it against the same training step in the step bench, side by side:
# GPT-2 124M O1 bf16 at B4 T64 (bench/gpt_bench.cpp "step 124m O1") and llama-15m O1 bf16 at B8 T256
# (bench/llama_bench.cpp), alternating run by run for ROUNDS rounds. Both sides leave out the same warm-up: castor
# train's steady rate (its summary's train_tokens_per_sec) starts after its first 3 steps (src/train/throughput.h's
# kWarmupSteps), and the step bench runs 3 warm-up steps before it times the rest, as many as castor train's. The step
# bench runs under the OpenMP wait policy castor train chose for itself (config.json's openmp_wait: the same step in
# the same environment, so the ratio is what surrounds the step) and under the other one (the bench at its best: what
# the choice costs). Prints the CPU, the load, every run as it comes, then per row the medians (min-max) and the
# ratio castor train / step bench under castor's policy (1.00: nothing lost around the step; the goal is >= 0.95).
#
#   bench/train_vs_step.sh [ROUNDS=3] [BUILD=./build]     (from the repository root, after scripts/setup.sh)
#   env: ONLY="gpt2" runs the rows whose name starts so; STEPS_SCALE=0.3 shortens every run (a smoke test of the
#        script: its figures are not measurements)
set -euo pipefail
rounds=${1:-3}
build=${2:-./build}
castor=$build/castor
for bin in castor gpt_bench llama_bench; do
  [ -x "$build/$bin" ] || { echo "train_vs_step.sh: $build/$bin is not built (cmake --build $build)" >&2; exit 1; }
done
renice -n -20 -p $$ >/dev/null 2>&1 || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw=$work/raw
scale=${STEPS_SCALE:-1}
warmup=3  # src/train/throughput.h's kWarmupSteps

# NAME | castor train flags (--steps added) | step bench command with WARMUP and ITERS for the counts | steps
rows=(
  "gpt2-124m-O1|--model gpt2 --data brown --batch-size 4 --block-size 64 --amp O1|gpt_bench step 124m O1 WARMUP ITERS|24"
  "llama-15m-O1|--model llama-15m --data brown-bpe --batch-size 8 --amp O1|llama_bench O1 6 8 WARMUP ITERS|30"
)

echo "# CPU: $("$castor" env | sed -n 's/^cpu *//p'); 2 threads, nice $(nice)" | tee -a "$raw"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $rounds rounds, load at the start:$(uptime | sed 's/.*load average://')" |
  tee -a "$raw"

# The other of the two wait policies castor chooses between.
other_policy() { if [ "$1" = OMP_WAIT_POLICY=passive ]; then echo GOMP_SPINCOUNT=3000; else echo OMP_WAIT_POLICY=passive; fi; }

for _ in $(seq "$rounds"); do
  for row in "${rows[@]}"; do
    IFS='|' read -r name flags bench steps <<<"$row"
    [[ -z "${ONLY:-}" || "$name" == "$ONLY"* ]] || continue
    steps=$(awk -v n="$steps" -v s="$scale" -v w=$warmup 'BEGIN { n = int(n * s); print n < w + 2 ? w + 2 : n }')
    rm -rf "$work/run"
    # shellcheck disable=SC2086  # the flags are words
    rate=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u CASTOR_OPENMP_WAIT "$castor" train $flags --steps "$steps" \
      --threads 2 --log-every 100000 --eval-every 0 --eval-iters 1 --keep 1 --out "$work/run" 2>"$work/err" |
      sed -n 's/.*"train_tokens_per_sec":\([0-9.e+]*\).*/\1/p') || true
    [ -n "$rate" ] || { echo "train_vs_step.sh: castor train failed: $(tail -1 "$work/err")" >&2; exit 1; }
    # config.json's "openmp_wait": "VARIABLE=VALUE (why)"
    policy=$(sed -n 's/.*"openmp_wait": *"\([A-Z_]*=[a-z0-9]*\).*/\1/p' "$work/run/config.json")
    [ -n "$policy" ] || { echo "train_vs_step.sh: $work/run/config.json records no openmp_wait" >&2; exit 1; }
    echo "$name castor $rate $policy" | tee -a "$raw"
    cmd=${bench/WARMUP/$warmup}
    cmd=${cmd/ITERS/$((steps - warmup))}
    for p in "$policy" "$(other_policy "$policy")"; do
      side=$([ "$p" = "$policy" ] && echo same || echo other)
      # shellcheck disable=SC2086  # the command is words
      v=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$p" "$build/"$cmd | awk '/^castor step/ { print $3 == "124m" ? $5 : $6 }')
      echo "$name step_$side $v $p" | tee -a "$raw"
    done
  done
done
echo "# load at the end:$(uptime | sed 's/.*load average://')" | tee -a "$raw"
echo
awk '
  function sort(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
  function stats(list,   a, n) { n = split(list, a, " "); if (!n) return "-"; sort(a, n)
    return sprintf("%.0f (%.0f-%.0f)", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, a[1], a[n]) }
  function med(list,   a, n) { n = split(list, a, " "); sort(a, n); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  $1 == "#" { next }
  { if (!($1 in seen)) { seen[$1] = 1; order[++rows] = $1 }
    v[$1, $2] = v[$1, $2] " " $3; pol[$1, $2] = $4
    if ($2 == "castor") last[$1] = $3
    if ($2 == "step_same") q[$1] = q[$1] " " last[$1] / $3 }
  END {
    print "| row | castor train (tok/s) | step bench, castor'"'"'s policy | step bench, the other policy | castor train / step bench (same policy) |"
    print "|---|---|---|---|---|"
    for (i = 1; i <= rows; i++) { r = order[i]
      printf "| %s | %s | %s %s | %s %s | %.2fx |\n", r, stats(v[r, "castor"]), stats(v[r, "step_same"]), pol[r, "step_same"],
        stats(v[r, "step_other"]), pol[r, "step_other"], med(q[r]) }
  }' "$raw"
