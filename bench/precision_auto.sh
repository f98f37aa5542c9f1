#!/usr/bin/env bash
# Each opt level's training speed and peak tensor memory against O0 (float32) on one CPU class, for the two default
# jobs: `castor train --steps 300` (SimpleCNN, Fashion-MNIST) and `castor train --model gpt --steps 200` (Brown
# characters). The CPU class is set with ONEDNN_MAX_CPU_ISA (CAP=AVX2 by default, the AVX2-only laptops and servers
# where `--precision auto` picks 32-true; CAP=AVX512_CORE is AVX-512 without BF16; CAP=none leaves the CPU as it is).
# O0 and the other levels alternate within each round, O0 first in odd rounds and last in even ones, so that a
# shared machine's drifting load falls on both; the per-round ratios and their range are printed. Speed is the run's
# training throughput (summary.json) and, less sensitive to other processes on a loaded machine, the inverse of the
# whole command's CPU time (user + system; idle OpenMP threads wait passively unless OMP_WAIT_POLICY says otherwise).
#
#   bench/precision_auto.sh [ROUNDS=3]
#   env: CAP (AVX2 | AVX512_CORE | none), LEVELS (default "bf16-mixed"; --precision values, O2-bf16, O2-fp16),
#        JOBS ("cnn gpt"),
#        CNN_STEPS (300), GPT_STEPS (200), CASTOR (build/castor), GPT_DATA (data/brown-char),
#        OMP_WAIT_POLICY (passive; "default" leaves libgomp's own, as a user's command runs)
# On a machine shared with other work, run it as `nice -n -20 bench/precision_auto.sh` (root, and with
# /proc/sys/kernel/sched_autogroup_enabled 0, else nice only ranks processes within one session).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
cap=${CAP:-AVX2}
levels=${LEVELS:-bf16-mixed}
jobs=${JOBS:-cnn gpt}
castor=$(realpath "${CASTOR:-build/castor}")
gpt_data=$(realpath "${GPT_DATA:-data/brown-char}")
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ "$OMP_WAIT_POLICY" = default ] && unset OMP_WAIT_POLICY  # libgomp's own (spin a while, then sleep), as users run
if [ "$cap" = none ]; then unset ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA; else export ONEDNN_MAX_CPU_ISA=$cap; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
"$castor" env | grep -E '^(cpu|oneDNN|threads|precision) '

# run JOB PRECISION: prints "<speed> <peak bytes> <cpu seconds>": the run's summary.json (images/s or tokens/s) and
# the command's user + system time.
run() {
  local job=$1 precision=$2 out="$work/$1-$2"
  rm -rf "$out"
  local args=(train --out "$out")
  case $precision in  # O2 has no Lightning spelling: O2-bf16, O2-fp16 as config.json names it
    O2-bf16) args+=(--amp O2 --dtype bf16) ;;
    O2-fp16) args+=(--amp O2 --dtype fp16) ;;
    *) args+=(--precision "$precision") ;;
  esac
  if [ "$job" = cnn ]; then args+=(--steps "${CNN_STEPS:-300}"); else
    args+=(--model gpt --data-dir "$gpt_data" --steps "${GPT_STEPS:-200}"); fi
  local TIMEFORMAT='%U %S'
  { time "$castor" "${args[@]}" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }; } 2>"$work/time"
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); u, k = open(sys.argv[2]).read().split()
speed = s["train_tokens_per_sec"] if "train_tokens_per_sec" in s else s["train_images_per_sec"]
print(speed, s["peak_memory_bytes"], float(u) + float(k))' \
    "$out/summary.json" "$work/time"
}

declare -A speed_ratios cpu_ratios mem_ratios
for job in $jobs; do
  for ((r = 1; r <= rounds; r++)); do
    order=(32-true $levels)
    [ $((r % 2)) -eq 0 ] && order=($levels 32-true)
    declare -A got=()
    for p in "${order[@]}"; do got[$p]=$(run "$job" "$p"); done
    read -r s0 m0 c0 <<<"${got[32-true]}"
    for p in $levels; do
      read -r s m c <<<"${got[$p]}"
      sr=$(python3 -c "print(f'{$s / $s0:.3f}')")
      cr=$(python3 -c "print(f'{$c0 / $c:.3f}')")
      mr=$(python3 -c "print(f'{$m / $m0:.3f}')")
      printf '%-4s round %d  %-11s %7.0f/s vs O0 %7.0f/s = %sx  cpu %6.1f vs %6.1f s = %sx  peak %5.1f vs %5.1f MiB = %sx\n' \
        "$job" "$r" "$p" "$s" "$s0" "$sr" "$c" "$c0" "$cr" "$(python3 -c "print($m / 1048576)")" \
        "$(python3 -c "print($m0 / 1048576)")" "$mr"
      speed_ratios[$job/$p]+="$sr "
      cpu_ratios[$job/$p]+="$cr "
      mem_ratios[$job/$p]+="$mr "
    done
  done
done
echo "# summary (ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}), relative to O0, min / median / max over $rounds rounds;" \
  "load now:$(uptime | sed 's/.*load average://')"
for key in "${!speed_ratios[@]}"; do
  python3 - "$key" ${speed_ratios[$key]} -- ${cpu_ratios[$key]} -- ${mem_ratios[$key]} <<'EOF'
import statistics, sys
key, rest = sys.argv[1], " ".join(sys.argv[2:]).split("--")
speed, cpu, mem = ([float(x) for x in part.split()] for part in rest)
fmt = lambda v: f"{min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}"
print(f"{key:<16} speed {fmt(speed)}x   1/cpu time {fmt(cpu)}x   peak memory {fmt(mem)}x")
EOF
done | sort
