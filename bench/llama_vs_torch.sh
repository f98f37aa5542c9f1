#!/usr/bin/env bash
# Issue #28's speed targets at the llama-15m shape (dim 288, 6 layers, 6 heads, context 256, vocabulary 512, batch
# 8 x 256): Castor's AdamW training steps (bench/llama_bench.cpp) against llama2.c's model.py semantics in PyTorch
# 1.13 at its best (bench/llama_torch.py: tcmalloc preloaded, torch.set_num_threads(2), OMP_WAIT_POLICY=passive for
# float32; bf16 autocast under its default policy and under passive, the faster counting), warm-up steps excluded,
# alternating run by run for ROUNDS rounds. Castor runs as the castor command starts (tools/castor.cpp: GOMP_SPINCOUNT=3000,
# a bounded spin) and under OMP_WAIT_POLICY=passive, the faster median counting, as PyTorch's faster policy does.
# Prints every run's line, then the medians over the rounds and the ratios (> 1: Castor faster):
#   O1 bf16 vs PyTorch bf16 autocast (target >= 1.5x), O0 vs PyTorch float32 (target >= 1.3x), and Castor's
#   grouped-query configuration (3 kv heads) vs its multi-head one at O1 (target >= 1.0x).
#
#   bench/llama_vs_torch.sh [ROUNDS=3] [LLAMA_BENCH=./build/llama_bench]   (from the repository root)
#   env: WARMUP (2), ITERS (3) steps per run
set -euo pipefail
rounds=${1:-3}
bin=${2:-./build/llama_bench}
here=$(cd "$(dirname "$0")" && pwd)
warmup=${WARMUP:-2}
iters=${ITERS:-3}
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "llama_vs_torch.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
[ -x "$bin" ] || { echo "llama_vs_torch.sh: $bin is not built (ninja -C build llama_bench)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); 2 threads; PyTorch" \
  "$(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with tcmalloc; $warmup warm-up + $iters timed steps"
torch() {  # torch POLICY LEVEL KV: a PyTorch run under OMP_WAIT_POLICY=passive or the default policy
  local policy=(env -u OMP_WAIT_POLICY) tag=torch
  if [ "$1" = passive ]; then policy=(env OMP_WAIT_POLICY=passive); tag=torchp; fi
  "${policy[@]}" LD_PRELOAD=$tcmalloc /usr/bin/python3 "$here/llama_torch.py" "$2" "$3" 8 "$warmup" "$iters" |
    grep '^torch' | sed "s/^torch/$tag/" | tee -a "$out"
}
castor() {  # castor LEVEL KV: a Castor run under the bounded spin (lines "castor") and one under passive ("castorp")
  env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=3000 "$bin" "$1" "$2" 8 "$warmup" "$iters" | grep '^castor' | tee -a "$out"
  env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive "$bin" "$1" "$2" 8 "$warmup" "$iters" | grep '^castor' |
    sed 's/^castor/castorp/' | tee -a "$out"
}
for _ in $(seq "$rounds"); do
  castor O0 6
  torch passive O0 6
  castor O1 6
  torch default O1 6
  torch passive O1 6
  castor O1 3
done
echo "# load now:$(uptime | sed 's/.*load average://')"
# Lines: "SIDE step llama-15m LEVEL KV TOKENS_PER_S".
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { v[$1 " " $4 " " $5] = v[$1 " " $4 " " $5] " " $6 }
  function faster(run,   s, p) { s = median(v["castor " run]); p = median(v["castorp " run]); return s > p ? s : p }
  END {
    c0 = faster("O0 6"); t0 = median(v["torchp O0 6"])
    c1 = faster("O1 6"); t1 = median(v["torch O1 6"]); t1p = median(v["torchp O1 6"])
    g1 = faster("O1 3"); best = t1p > t1 ? t1p : t1
    printf "medians, tokens/s (each side its faster policy): Castor O0 %.0f, O1 %.0f (spin %.0f, passive %.0f), O1 GQA (3 kv heads) %.0f; PyTorch fp32 %.0f, bf16 autocast %.0f (passive %.0f)\n", c0, c1, median(v["castor O1 6"]), median(v["castorp O1 6"]), g1, t0, t1, t1p
    printf "O1 bf16 / PyTorch bf16 autocast: %.2fx (target >= 1.5x)\n", c1 / best
    printf "O0 / PyTorch fp32:               %.2fx (target >= 1.3x)\n", c0 / t0
    printf "GQA / multi-head, Castor O1:     %.2fx (target >= 1.0x)\n", g1 / c1
  }' "$out"
