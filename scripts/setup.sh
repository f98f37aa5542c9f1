#!/usr/bin/env bash
# Installs everything Castor needs on Debian 12 (safe to run again), then configures and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

# libtcmalloc-minimal4: the benchmarks run their PyTorch twins with it, PyTorch's fastest allocator here (docs/benchmarks.md).
# libpng-dev, libjpeg62-turbo-dev: --data folder decodes images; chromium: scripts/report_screenshot.sh.
packages=(build-essential cmake ninja-build pkg-config libdnnl-dev zlib1g-dev libcli11-dev libgtest-dev googletest
          python3-torch libopenblas0-pthread dataset-fashion-mnist clang libclang-rt-14-dev
          libopenmpi-dev openmpi-bin libtcmalloc-minimal4 libpng-dev libjpeg62-turbo-dev chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Open MPI runs the data-parallel jobs: `mpirun -np N castor train ...` (as root, mpirun also needs --allow-run-as-root;
# on a machine with fewer cores than ranks, --oversubscribe). The MPI tests (Mpirun*) launch it that way.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
