#!/usr/bin/env bash
# Issue #20's interop check on the real GPT-2 124M shape (LlmcInterop.TenAdamWStepsMatchPyTorch does it on a small
# config in ctest): PyTorch (tests/oracle/llmc_oracle.py) writes a random 124M nanoGPT twin as an llm.c checkpoint
# (V 50,257 padded to 50,304, maxT 1024) and a token file, and trains 10 AdamW steps (lr 1e-4, weight decay 0.01) on
# llm.c-order batches of B=4, T=64; build/llmc_interop_bench loads the file and does the same at O0 and O1 bf16.
# Exit status 0 when O0 is within 1e-4 relative and O1 within 0.02 at every step. About 2 GiB of memory, 1.5 GB disk.
#
#   bench/llmc_interop.sh [small|124m]    (default 124m; run from the repository root after building llmc_interop_bench)
set -euo pipefail
shape=${1:-124m}
bench=./build/llmc_interop_bench
[ -x "$bench" ] || { echo "llmc_interop.sh: $bench missing (ninja -C build llmc_interop_bench)" >&2; exit 1; }
case $shape in
  124m) model='"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50257, "padded_vocab_size": 50304' ;;
  small) model='"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32, "vocab_size": 101, "padded_vocab_size": 128' ;;
  *) echo "llmc_interop.sh: unknown shape '$shape' (small or 124m)" >&2; exit 2 ;;
esac
B=4 T=64 steps=10 lr=1e-4 wd=0.01
[ "$shape" = small ] && T=32
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
preload=""
[ -r "$tcmalloc" ] && preload=$tcmalloc
OMP_WAIT_POLICY=passive LD_PRELOAD=$preload /usr/bin/python3 tests/oracle/llmc_oracle.py \
  "{$model, \"batch_size\": $B, \"seq_len\": $T, \"steps\": $steps, \"lr\": $lr, \"weight_decay\": $wd, \"seed\": 1}" "$out"
OMP_WAIT_POLICY=passive "$bench" "$out" $B $T $steps $lr $wd
