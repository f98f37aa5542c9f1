#!/usr/bin/env bash
# Tests Castor as a user consumes it: installs the build into a temp prefix, builds examples/ against it with
# CMake (find_package) and with pkg-config, trains the example on small CIFAR-10 files, checks that a subproject
# build needs no GoogleTest, and compiles every C++ snippet of README.md and docs/*.md against the installed headers.
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
