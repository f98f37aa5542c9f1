#!/usr/bin/env bash
# Trains SimpleCNN on Fashion-MNIST at each opt level and prints the docs/results.md table (mean over seeds).
# usage: scripts/results.sh [EPOCHS=5] [SEEDS="0 1 2"] [DATA=fashion-mnist] [DATA_DIR=]
# Runs already finished under runs/results are reused; delete that directory to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${EPOCHS:-5}
seeds=${SEEDS:-0 1 2}
data=${DATA:-fashion-mnist}
extra=()
[ -n "${DATA_DIR:-}" ] && extra=(--data-dir "$DATA_DIR")
configs=("O0 bf16" "O1 bf16" "O1 fp16" "O2 fp16" "O2 bf16" "O3 bf16 --stochastic-rounding")
out=runs/results
mkdir -p "$out"
for cfg in "${configs[@]}"; do
  read -r level dtype rest <<<"$cfg"
  for seed in $seeds; do
    name="$level-$dtype${rest:+-sr}-seed$seed"
    # A finished run (its summary line saved) is kept: rerunning adds seeds without repeating the ones done.
    grep -q test_accuracy "$out/$name.json" 2>/dev/null && continue
    ./build/castor train --data "$data" "${extra[@]}" --amp "$level" --dtype "$dtype" $rest --epochs "$epochs" \
      --seed "$seed" --out "$out/$name" | tail -n 1 >"$out/$name.json"
  done
done
/usr/bin/python3 - "$out" "$epochs" "$seeds" "${configs[@]}" <<'PY'
import json, statistics, sys
out, epochs, seeds, configs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
print(f"| config | test accuracy (mean of {len(seeds)} seeds, {epochs} epochs) | per seed | images/s | peak memory (MiB) | skipped steps |")
print("|---|---|---|---|---|---|")
for cfg in configs:
    level, dtype, *rest = cfg.split()
    runs = [json.load(open(f"{out}/{level}-{dtype}{'-sr' if rest else ''}-seed{s}.json")) for s in seeds]
    acc = [100 * r["test_accuracy"] for r in runs]
    label = f"{level} {'float32' if level == 'O0' else dtype}{' + stochastic rounding' if rest else ''}"
    print(f"| {label} | {statistics.mean(acc):.2f}% | {', '.join(f'{a:.2f}' for a in acc)} | "
          f"{statistics.mean(r['train_images_per_sec'] for r in runs):.0f} | "
          f"{max(r['peak_memory_bytes'] for r in runs) / 2**20:.1f} | {sum(r['skipped_steps'] for r in runs)} |")
PY
