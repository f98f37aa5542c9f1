#!/usr/bin/env bash
# Renders a run's report.html in headless Chromium (Debian's chromium package) to a PNG, to look at it as a
# person would: scripts/report_screenshot.sh RUN_DIR [OUT.png]
set -euo pipefail
run=${1:?usage: report_screenshot.sh RUN_DIR [OUT.png]}
png=${2:-$run/report.png}
command -v chromium >/dev/null || { echo "report_screenshot.sh: needs chromium (apt-get install chromium)" >&2; exit 1; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
  --window-size=1150,1500 --screenshot="$(realpath -m "$png")" "file://$(realpath "$run")/report.html" 2>/dev/null
echo "$png"
