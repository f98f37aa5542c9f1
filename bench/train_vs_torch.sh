#!/usr/bin/env bash
# Issue #11's measurement: `castor train` (SimpleCNN, synthetic data, Adam, batch 256, 2 threads) at O0/O1/O2/O3 bf16
# and O1 fp16 against the PyTorch twin in its best configuration (tcmalloc), alternating for ROUNDS rounds; prints
# one line per run: "castor LEVEL DTYPE IMAGES_PER_SEC PEAK_BYTES" or "torch MODE IMAGES_PER_SEC".
#
#   bench/train_vs_torch.sh [ROUNDS] [CASTOR_BINARY]      (defaults: 3, ./build/castor; run from the repository root)
set -euo pipefail
rounds=${1:-3}
castor=${2:-./build/castor}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "train_vs_torch.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
for _ in $(seq "$rounds"); do
  for config in "O0 bfloat16" "O1 bfloat16" "O2 bfloat16" "O3 bfloat16" "O1 float16"; do
    set -- $config
    rm -rf "$out/run"
    json=$(OMP_WAIT_POLICY=passive "$castor" train --data synthetic --synthetic-size 20480 --model simplecnn \
             --amp "$1" --dtype "$2" --optimizer adam --batch-size 256 --steps 40 --eval-every 0 --threads 2 \
             --out "$out/run" 2>&1 | tail -1)
    ips=$(grep -o '"train_images_per_sec":[0-9.]*' <<<"$json" | cut -d: -f2)
    peak=$(grep -o '"peak_memory_bytes":[0-9]*' <<<"$json" | cut -d: -f2)
    echo "castor $1 $2 $ips $peak"
  done
  LD_PRELOAD=$tcmalloc /usr/bin/python3 bench/train_step_torch.py simplecnn 256 3 10 3 2 fp32 fp32_cl bf16 bf16_cl |
    sed 's/^/torch /'
done
