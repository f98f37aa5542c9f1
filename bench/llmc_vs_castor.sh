#!/usr/bin/env bash
# Issue #20's "O0 >= 4x llm.c's CPU trainer": llm.c's train_gpt2.c (float32, OpenMP, built here from YOUR llm.c
# checkout with its Makefile's flags: -Ofast -march=native -fopenmp) against Castor's O0 step (bench/gpt_bench.cpp)
# on the same model, batch and sequence length, alternating for ROUNDS rounds; prints the CPU ISA, each run's
# tokens/s and the medians' ratio. Castor writes the initial weights (gpt_bench llmc) and llm.c trains on Brown
# tokens from scripts/setup.sh (data/brown for GPT-2 124M, data/brown-char for the char model).
#
#   bench/llmc_vs_castor.sh LLMC_DIR [ROUNDS] [STEPS]      (defaults: 2 rounds, 4 timed llm.c steps; from the repo root)
#
# Configurations (those of bench/gpt_vs_torch.sh): 124m = GPT-2 124M, B=4, T=64 (train_gpt2.c's own); char = 6
# layers, 6 heads, 384 wide, V=85, B=8, T=256. train_gpt2.c is copied and only its B, T and step count are changed
# (sed); its step time is its own "took X ms" (forward, backward, AdamW update), the first step left out. llm.c runs
# under the OpenMP wait policy of the environment, Castor with the castor command's bounded spin (GOMP_SPINCOUNT=3000).
set -euo pipefail
llmc=${1:?usage: bench/llmc_vs_castor.sh LLMC_DIR [ROUNDS] [STEPS]}
rounds=${2:-2}
steps=${3:-4}
bin=./build/gpt_bench
[ -r "$llmc/train_gpt2.c" ] || { echo "llmc_vs_castor.sh: $llmc/train_gpt2.c not found (an llm.c checkout)" >&2; exit 1; }
[ -x "$bin" ] || { echo "llmc_vs_castor.sh: $bin is not built (ninja -C build gpt_bench)" >&2; exit 1; }
for d in data/brown data/brown-char; do
  [ -r "$d/train.bin" ] || { echo "llmc_vs_castor.sh: $d/train.bin missing (run scripts/setup.sh)" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "CPU: $("$bin" isa); 2 threads; llm.c $(git -C "$llmc" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)')"

# name B T data
configs=("124m 4 64 data/brown" "char 8 256 data/brown-char")
for config in "${configs[@]}"; do
  set -- $config
  mkdir -p "$dir/$1/dev/data/tinyshakespeare"
  ln -s "$(pwd)/$4/train.bin" "$dir/$1/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
  ln -s "$(pwd)/$4/val.bin" "$dir/$1/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
  "$bin" llmc "$1" "$dir/$1/gpt2_124M.bin"
  sed -e "s/int B = 4;/int B = $2;/" -e "s/int T = 64;/int T = $3;/" -e "s/step <= 40;/step <= $steps;/" \
    "$llmc/train_gpt2.c" > "$dir/$1/train_gpt2.c"
  grep -q "int B = $2;" "$dir/$1/train_gpt2.c" && grep -q "step <= $steps;" "$dir/$1/train_gpt2.c" ||
    { echo "llmc_vs_castor.sh: $llmc/train_gpt2.c no longer has the lines this script changes" >&2; exit 1; }
  gcc -Ofast -march=native -fopenmp -I"$llmc" -Wno-unused-result "$dir/$1/train_gpt2.c" -lm -o "$dir/$1/train_gpt2"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
declare -A castor llm
for r in $(seq "$rounds"); do
  for config in "${configs[@]}"; do
    set -- $config
    c=$(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=3000 "$bin" step "$1" O0 1 3 | awk '/^castor step/ {print $5}')
    # llm.c's steps after the first: "step N: train loss L (took MS ms)"
    ms=$(cd "$dir/$1" && OMP_NUM_THREADS=2 ./train_gpt2 |
           awk '/^step [0-9]+: train loss/ && $2 != "0:" {print $(NF - 1)}' | sed 's/(took //' | median)
    l=$(awk -v b="$2" -v t="$3" -v ms="$ms" 'BEGIN {printf "%.1f", b * t * 1000 / ms}')
    echo "round $r $1: castor O0 $c tok/s, llm.c $l tok/s" >&2
    castor[$1]+=" $c"; llm[$1]+=" $l"
  done
done
printf "%-6s %14s %14s %8s\n" model "castor O0" "llm.c" ratio
for config in "${configs[@]}"; do
  set -- $config
  c=$(echo "${castor[$1]}" | median); l=$(echo "${llm[$1]}" | median)
  awk -v n="$1" -v c="$c" -v l="$l" 'BEGIN {printf "%-6s %10.0f t/s %10.0f t/s %7.2fx\n", n, c, l, c / l}'
done
