#!/usr/bin/env bash
# Tests Castor as a user consumes it: installs the build into a temp prefix, builds examples/ against it with
# CMake (find_package) and with pkg-config, trains the example on small CIFAR-10 files, checks that a subproject
# build needs no GoogleTest, builds a consumer that sets no C++ standard (the target carries C++20), installs a shared
# build (-DBUILD_SHARED_LIBS=ON) whose bin/castor runs from the prefix, and compiles every C++ snippet of README.md and
# docs/*.md against the installed headers.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/castor" && test -f "$prefix/include/castor/castor.h"

# Two tiny CIFAR-10 binary sets (label byte + 3072 pixel bytes per record).
/usr/bin/python3 - "$work/cifar" <<'PY'
import os, random, sys
d = sys.argv[1]; os.makedirs(d); rng = random.Random(0)
for name, n in [(f"data_batch_{i}.bin", 20) for i in range(1, 6)] + [("test_batch.bin", 30)]:
    with open(os.path.join(d, name), "wb") as f:
        for _ in range(n):
            f.write(bytes([rng.randrange(10)]) + bytes(rng.randrange(256) for _ in range(3072)))
PY

echo "package: find_package(castor) build of examples/cifar10_amp"
cmake -S examples/cifar10_amp -B "$work/ex" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/ex" >/dev/null
"$work/ex/cifar10_amp" "$work/cifar" 1 32 | tee "$work/out.txt"
grep -q "test accuracy: .* of 30 images" "$work/out.txt"

echo "package: pkg-config build of the same example"
# shellcheck disable=SC2046
g++ -O1 examples/cifar10_amp/main.cpp -o "$work/ex_pc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs castor)
"$work/ex_pc" "$work/cifar" 1 32 | grep -q "test accuracy"

echo "package: as a subproject, Castor configures without GoogleTest and adds no tests"
cmake -S examples/cifar10_amp -B "$work/sub" -G Ninja -DCASTOR_SOURCE="$PWD" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
  >/dev/null
if cmake --build "$work/sub" --target help | grep -q castor_tests; then
  echo "error: the subproject build defines castor_tests" >&2
  exit 1
fi

# A consumer as most projects write it: no CMAKE_CXX_STANDARD, only the target (castor.h needs C++20: std::span).
mkdir -p "$work/plain"
cat > "$work/plain/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.21)
project(plain CXX)
find_package(castor REQUIRED)
add_executable(plain main.cpp)
target_link_libraries(plain PRIVATE castor::castor)
CMAKE
cat > "$work/plain/main.cpp" <<'CPP'
#include <castor/castor.h>
#include <cstdio>
int main() {
  const castor::Tensor t = castor::ones({2, 3});
  std::printf("sum %g\n", castor::sum(t).item());
}
CPP
check_plain_consumer() {  # $1: the prefix, $2: a build folder
  cmake -S "$work/plain" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$1" >/dev/null
  cmake --build "$2" >/dev/null
  "$2/plain" | grep -qx "sum 6"
}
echo "package: a consumer that sets no C++ standard gets C++20 from castor::castor"
check_plain_consumer "$prefix" "$work/plain-static"

# The shared library: bin/castor finds lib/libcastor.so through its $ORIGIN/../lib RPATH, without LD_LIBRARY_PATH.
# Built in $build/package-shared (kept between runs; only the library and the command, through ccache when it is here).
echo "package: a shared build installs a bin/castor that runs"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build/package-shared" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCASTOR_BUILD_TESTS=OFF -DCASTOR_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build/package-shared" --target castor castor_cli >/dev/null
cmake --install "$build/package-shared" --prefix "$work/shared" >/dev/null
test -f "$work/shared/lib/libcastor.so.0"
(cd "$work" && env -u LD_LIBRARY_PATH "$work/shared/bin/castor" train --data synthetic --synthetic-size 64 \
  --batch-size 16 --steps 2 --amp O0 --threads 1 --out "$work/shared-run" 2>/dev/null) | grep -q '"steps":2'
check_plain_consumer "$work/shared" "$work/plain-shared"

echo "package: every C++ snippet of README.md and docs/*.md compiles"
n=0
for md in README.md docs/*.md; do
  awk -v out="$work/snip" -v base="$(basename "$md" .md)" '
    /^```cpp/ { on = 1; k++; file = out "_" base "_" k ".cpp"; next }
    /^```/ && on { on = 0; close(file); next }
    on { print > file }' "$md"
done
for f in "$work"/snip_*.cpp; do
  [ -e "$f" ] || continue
  g++ -std=c++20 -fsyntax-only -I"$prefix/include" "$f" || { echo "error: snippet $(basename "$f") does not compile" >&2; exit 1; }
  n=$((n + 1))
done
echo "package: $n snippets compiled"
