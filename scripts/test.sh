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

# ctest in build directory $1 (its other flags after it), tee'd to the log. A failure stops the script, after printing
# at the end, where a CI log's tail shows it: each failed test's whole output (from ctest's LastTest.log, whatever was
# interleaved with it above) and then the failed tests rerun alone: one that passes there failed by interference
# (load, timing), not by its own result, and is a flake to fix.
suite() {
  local dir=$1 status=0
  shift
  ctest --test-dir "$dir" --output-on-failure "$@" 2>&1 | tee "$log" || status=$?
  [ "$status" -eq 0 ] && return 0
  local failed
  failed=$(cut -d: -f2- "$dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null || true)
  echo
  echo "==== $dir: the output of each failed test ===="
  for t in $failed; do
    awk -v t="$t" '/^[0-9]+\/[0-9]+ Test: / && substr($0, index($0, " Test: ") + 7) == t {on = 1}
                   on {print} on && index($0, "\"" t "\" time elapsed") == 1 {on = 0}' "$dir/Testing/Temporary/LastTest.log"
  done
  echo "==== $dir: the failed tests rerun alone ===="
  ctest --test-dir "$dir" --rerun-failed --output-on-failure "$@" 2>&1 | tail -n 40 || true
  echo "==== $dir: failed: $(echo $failed) ===="
  exit 1
}

suite build -j"$(nproc)"
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
  suite build-asan -j"$(nproc)" -E "AllFloat32Patterns|Trainer\.|ResumeTest|ModelFit|RunDir\.|Mpirun|IsaCap"
sanitized=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log")

./scripts/fuzz.sh "${CASTOR_FUZZ_SECONDS:-30}"

# Every failure above stops the script (set -e, pipefail), so reaching here means all passed.
fuzz_targets=$(find fuzz -name '*_fuzz.cpp' | wc -l)
echo "tests: $release in Release, $sanitized under ASan+UBSan, $fuzz_targets fuzz targets, 1 package check"
echo "$((release + sanitized + fuzz_targets + 1)) passed, 0 failed"
