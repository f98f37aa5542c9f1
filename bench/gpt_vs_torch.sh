#!/usr/bin/env bash
# Issue #19/#20's measurement: Castor's GPT (bench/gpt_bench.cpp) against nanoGPT's model in PyTorch 1.13 at its best
# (bench/gpt_torch_bench.py: tcmalloc preloaded, torch.set_num_threads(2), OMP_WAIT_POLICY=passive for fp32, bf16
# autocast without it), alternating Castor and PyTorch run by run for ROUNDS rounds. Prints the CPU ISA, the GEMM
# peaks, then per measurement the medians over rounds and the ratio (>1: Castor faster): one block's forward+backward
# (ms) and training steps (tokens/s, model FLOP/s, MFU against the measured GEMM peak of the same dtype). Castor
# runs with the castor command's bounded spin (GOMP_SPINCOUNT=3000) and with OMP_WAIT_POLICY=passive, PyTorch bf16
# autocast with its default policy and with passive; each side's faster counts.
#
#   bench/gpt_vs_torch.sh [ROUNDS] [GPT_BENCH]      (defaults: 3, ./build/gpt_bench; run from the repository root)
#   SKIP_124M=1 leaves out the GPT-2 124M steps; BIG=1 adds GPT-2 124M O1 at B8 T256 (products of 2048 rows);
#   ONLY="step char O1" runs just that line; BEFORE=OTHER_GPT_BENCH also runs another build (labelled "before") in
#   each round and prints its figures and castor/before.
set -euo pipefail
rounds=${1:-3}
bin=${2:-./build/gpt_bench}
here=$(cd "$(dirname "$0")" && pwd)
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "gpt_vs_torch.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
[ -x "$bin" ] || { echo "gpt_vs_torch.sh: $bin is not built (ninja -C build gpt_bench)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$dir/raw  # every run's line, also echoed to stderr as it comes
echo "CPU: $("$bin" isa); 2 threads; PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with tcmalloc"
items=("block char O0 10" "block char O1 10" "block 124m O0 10" "block 124m O1 10"
       "step char O0 1 3" "step char O1 1 3")
[ -n "${SKIP_124M:-}" ] || items+=("step 124m O0 1 3" "step 124m O1 1 3")
[ -z "${BIG:-}" ] || items+=("step 124m-8x256 O1 1 3")
if [ -n "${ONLY:-}" ]; then
  keep=()
  for item in "${items[@]}"; do [[ "$item" == "$ONLY"* ]] && keep+=("$item"); done
  items=("${keep[@]}")
fi
OMP_WAIT_POLICY=passive "$bin" peak | tee -a "$out" >&2
for r in $(seq "$rounds"); do
  for item in "${items[@]}"; do
    set -- $item
    # Castor, like PyTorch, under two OpenMP wait policies: the bounded spin the castor command sets by default
    # (tools/castor.cpp: GOMP_SPINCOUNT=3000) and passive.
    env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=3000 "$bin" "$@" | grep '^castor' | tee -a "$out" >&2
    OMP_WAIT_POLICY=passive "$bin" "$@" | grep '^castor' | sed 's/^castor/castorp/' | tee -a "$out" >&2
    [ -z "${BEFORE:-}" ] || OMP_WAIT_POLICY=passive "$BEFORE" "$@" | grep '^castor' | sed 's/^castor/before/' |
      tee -a "$out" >&2
    if [ "$3" = O0 ]; then policy=(env OMP_WAIT_POLICY=passive); else policy=(env -u OMP_WAIT_POLICY); fi
    "${policy[@]}" LD_PRELOAD=$tcmalloc /usr/bin/python3 "$here/gpt_torch_bench.py" "$@" | grep '^torch' | tee -a "$out" >&2
    # bf16 autocast under OMP_WAIT_POLICY=passive too: on a loaded machine spinning threads can make the default
    # policy PyTorch's worse one; the ratio is taken against whichever of the two is faster.
    [ "$3" = O0 ] || OMP_WAIT_POLICY=passive LD_PRELOAD=$tcmalloc /usr/bin/python3 "$here/gpt_torch_bench.py" "$@" |
      grep '^torch' | sed 's/^torch/torchp/' | tee -a "$out" >&2
  done
done
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int((n + 1) / 2)]
  }
  $2 == "peak" { peak[$3] = $4; next }
  { if ($1 == "before") has_before = 1
    key = $2 " " $3 " " $4; v[$1, key] = v[$1, key] " " $5; if (NF >= 6) fpt[key] = $6 / $5
    if (!(key in seen)) { seen[key] = 1; order[++n] = key } }
  END {
    printf "GEMM peak (2048^3 oneDNN matmul): fp32 %.0f GFLOP/s, bf16 %.0f GFLOP/s\n", peak["fp32"] / 1e9, peak["bf16"] / 1e9
    printf "%-16s %12s %12s %8s %14s %14s %9s %9s", "what", "castor", "torch", "ratio", "castor GFLOP/s",
           "torch GFLOP/s", "castorMFU", "torchMFU"
    if (has_before) printf " %12s %8s", "before", "vs before"
    printf "\n"
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, f, " "); c = median(v["castor", k]); t = median(v["torch", k]); policy = ""
      if (v["castorp", k] != "") {
        cp = median(v["castorp", k])
        if (f[1] == "block" ? cp < c : cp > c) { c = cp; policy = " castor passive" }
      }
      if (v["torchp", k] != "") {
        tp = median(v["torchp", k]); policy = policy " (torch passive " (f[1] == "block" ? sprintf("%.2f ms", tp) : sprintf("%.0f t/s", tp)) ")"
        if (f[1] == "block" ? tp < t : tp > t) { t = tp; policy = policy "*" }
      }
      if (f[1] == "block") {
        printf "%-16s %9.2f ms %9.2f ms %7.2fx %14s %14s %9s %9s", k, c, t, t / c, "", "", "", ""
        if (has_before) { b = median(v["before", k]); printf " %9.2f ms %7.2fx", b, b / c }
        printf "%s\n", policy; continue
      }
      p = f[3] == "O1" ? peak["bf16"] : peak["fp32"]
      printf "%-16s %8.0f t/s %8.0f t/s %7.2fx %14.1f %14.1f %8.1f%% %8.1f%%", k, c, t, c / t, c * fpt[k] / 1e9,
             t * fpt[k] / 1e9, 100 * c * fpt[k] / p, 100 * t * fpt[k] / p
      if (has_before) { b = median(v["before", k]); printf " %8.0f t/s %7.2fx", b, c / b }
      printf "%s\n", policy
    }
    print "Castor: the faster of its runs with GOMP_SPINCOUNT=3000 and with OMP_WAIT_POLICY=passive (\"castor passive\": the latter)."
    print "O1 rows: torch is PyTorch bf16 autocast under its default OpenMP policy; \"(torch passive ...)\" is the same"
    print "under OMP_WAIT_POLICY=passive, and \"*\" marks that the ratio is taken against that faster figure."
  }' "$out"
