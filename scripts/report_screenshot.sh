#!/usr/bin/env bash
# Renders a run's report.html in headless Chromium (Debian's chromium package) to a PNG, to look at it as a
# person would: scripts/report_screenshot.sh RUN_DIR [OUT.png]. Without arguments it regenerates docs/report.png from
# a fresh run: 400 steps of SimpleCNN on Fashion-MNIST with fp16 mixed precision (loss scaling shows), a cosine
# schedule and an evaluation every 100 steps (build/castor must be built).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { echo "report_screenshot.sh: needs chromium (apt-get install chromium)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -eq 0 ]; then
  run=$tmp/run
  png=docs/report.png
  ./build/castor train --steps 400 --precision 16-mixed --schedule cosine --eval-every 100 --log-every 10 \
    --out "$run" >/dev/null
else
  run=$1
  png=${2:-$run/report.png}
fi
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$tmp/profile" --hide-scrollbars \
  --window-size=1180,2400 --screenshot="$(realpath -m "$png")" "file://$(realpath "$run")/report.html" 2>/dev/null
echo "$png"
