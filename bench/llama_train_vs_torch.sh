#!/usr/bin/env bash
# Issue #41 item 3's measurement: Llama O1 bf16 at the llama-15m shape (6 layers, 288 wide, 6 heads, context 256,
# vocabulary 512, batch 8) through `castor train` as a user runs it (the steady-state train_tokens_per_sec of its
# summary, on setup's brown-bpe tokens), against bench/llama_torch.py's PyTorch 1.13 bf16 autocast at its best
# (tcmalloc preloaded, torch.set_num_threads(2), the default OpenMP policy and passive, the faster counting),
# alternating run by run for ROUNDS rounds. Prints the CPU, every run's rate, the medians and the ratio (> 1: Castor
# faster). On a shared machine run it at a high priority for both sides alike (`nice -n -20`, as root).
#
#   bench/llama_train_vs_torch.sh [ROUNDS=3] [CASTOR=./build/castor]   (from the repository root)
#   env: STEPS (30) castor train steps per run; WARMUP (2), ITERS (5) PyTorch steps per run
set -euo pipefail
rounds=${1:-3}
bin=${2:-./build/castor}
here=$(cd "$(dirname "$0")" && pwd)
steps=${STEPS:-30}
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "llama_train_vs_torch.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
[ -x "$bin" ] || { echo "llama_train_vs_torch.sh: $bin is not built (ninja -C build castor)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://'), nice $(nice)"
echo "# CPU: $("$bin" env | sed -n 's/^cpu *//p'); $("$bin" env | sed -n 's/^oneDNN *//p'); 2 threads"
for _ in $(seq "$rounds"); do
  "$bin" train --model llama-15m --data brown-bpe --amp O1 --batch-size 8 --steps "$steps" --warmup-steps 1 \
    --log-every 1000 --eval-every 0 --eval-iters 1 --out "$dir/run" --overwrite 2>/dev/null |
    sed -n 's/.*"train_tokens_per_sec":\([0-9.]*\).*/castor \1/p' | tee -a "$dir/raw"
  for policy in default passive; do
    env $([ $policy = passive ] && echo OMP_WAIT_POLICY=passive || echo -u OMP_WAIT_POLICY) LD_PRELOAD=$tcmalloc \
      /usr/bin/python3 "$here/llama_torch.py" O1 6 8 "${WARMUP:-2}" "${ITERS:-5}" |
      awk -v p=$policy '{print "torch_" p, $6}' | tee -a "$dir/raw"
  done
done
echo "# load now:$(uptime | sed 's/.*load average://')"
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { v[$1] = v[$1] " " $2 }
  END {
    c = median(v["castor"]); d = median(v["torch_default"]); p = median(v["torch_passive"]); t = d > p ? d : p
    printf "medians, tokens/s: castor train O1 %.0f; PyTorch bf16 autocast %.0f (default policy) / %.0f (passive)\n", c, d, p
    printf "castor train O1 / PyTorch bf16 autocast at its best: %.2fx (target >= 1.5x)\n", c / t
  }' "$dir/raw"
