#!/usr/bin/env bash
# Builds and runs every test: the unit suite (Release), again under ASan+UBSan, and a bounded fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup_tests.sh
# Tests run two at a time on two cores: OpenMP threads must sleep, not spin, while they wait.
export OMP_WAIT_POLICY=passive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir build --output-on-failure -j"$(nproc)" | tee "$log"
release=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log")
# The installed package as a user consumes it (CMake package, pkg-config, subproject, doc snippets).
./scripts/check_package.sh build

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCASTOR_SANITIZE=ON
cmake --build build-asan -j"$(nproc)" --target castor_tests castor_cli castor_dist_helper
# The unit tests again under the sanitizers; the end-to-end training runs (RunDir: the binary under faults, some
# under memory limits ASan cannot run in) and the 2^32-pattern sweep, which only repeat unit-tested code for
# minutes at sanitizer speed, run in the Release pass above; so do the Mpirun* tests (whole jobs under `mpirun -np 2`:
# Open MPI under ASan is slow and reports its own allocations) and the IsaCap.* reruns of unit tests on other ISA paths
# (over 3 minutes each under ASan; on an AVX2-only machine this pass runs those paths anyway). The GPT training
# tests (GptAmp, LmTrain, LlmcInterop) stay: small models, under a minute together at sanitizer speed.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E "AllFloat32Patterns|Trainer\.|ResumeTest|ModelFit|RunDir\.|Mpirun|IsaCap" \
  | tee "$log"
sanitized=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log")

./scripts/fuzz.sh "${CASTOR_FUZZ_SECONDS:-30}"

# Every failure above stops the script (set -e, pipefail), so reaching here means all passed.
echo "tests: $release in Release, $sanitized under ASan+UBSan, 4 fuzz targets, 1 package check"
echo "$((release + sanitized + 5)) passed, 0 failed"
