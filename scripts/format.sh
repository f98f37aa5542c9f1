#!/usr/bin/env bash
# Formats the C++ sources in place with .clang-format (clang-format 14); --check lists what would change instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files src include tests tools bench fuzz | grep -E '\.(cpp|h)$')
if [[ "${1:-}" == "--check" ]]; then
  clang-format --dry-run "${files[@]}"
else
  clang-format -i "${files[@]}"
fi
