#!/usr/bin/env bash
# Builds and runs every test: the unit suite (Release), again under ASan+UBSan, and a bounded fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCASTOR_SANITIZE=ON
cmake --build build-asan -j"$(nproc)" --target castor_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E "AllFloat32Patterns|Slow"

if [ -x scripts/fuzz.sh ]; then ./scripts/fuzz.sh "${CASTOR_FUZZ_SECONDS:-30}"; fi
