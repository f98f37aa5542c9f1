#!/usr/bin/env bash
# Builds the libFuzzer targets (one per fuzz/NAME_fuzz.cpp) with clang in build-fuzz and runs each for SECONDS seconds;
# fails on any crash.
set -euo pipefail
seconds=${1:?usage: scripts/fuzz.sh SECONDS}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz

cmake -S "$root" -B "$build" -DCASTOR_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j2
for source in "$root"/fuzz/*_fuzz.cpp; do
  parser=$(basename "$source" _fuzz.cpp)
  corpus=$build/corpus/$parser
  mkdir -p "$corpus" "$build/crashes"
  dict=()
  [[ -f $root/fuzz/$parser.dict ]] && dict=(-dict="$root/fuzz/$parser.dict")
  echo "== fuzz_$parser for ${seconds}s"
  "$build/fuzz_$parser" -max_total_time="$seconds" -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$build/crashes/$parser-" "${dict[@]}" "$corpus" "$root/fuzz/seeds/$parser"
done
echo "fuzzing: no crashes"
