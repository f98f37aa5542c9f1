#!/usr/bin/env bash
# The summary table of docs/benchmarks.md from one command: every side-by-side comparison, Castor through `castor
# train` as a user runs it (the steady rate of its summary line; castor chooses its own OpenMP wait policy) against
# its PyTorch 1.13 twin at its best (tcmalloc preloaded, 2 threads, channels_last where it helps, the default OpenMP
# policy and passive: the faster counts), alternating run by run for ROUNDS rounds. Prints the CPU, the load, every
# run as it comes, then per row the median, min and max of each side and of the per-round ratio (> 1: Castor faster),
# and the table as docs/benchmarks.md holds it. On a shared machine run it at a high priority for both sides alike
# (`nice -n -20`, as root: the script renices itself when it can).
#
#   bench/all.sh [ROUNDS=5] [CASTOR=./build/castor]      (from the repository root, after scripts/setup.sh)
#   bench/all.sh --table RAW                             the table again from a run's raw lines (RAW=... below)
#   bench/all.sh --docs RAW                              ... written into docs/benchmarks.md between its markers
#   env: ONLY="gpt2" runs the rows whose name starts so; RAW=FILE keeps the raw lines there (default: a temp file);
#        STEPS_SCALE=0.2 shortens every run (a smoke test of the script: its figures are not measurements)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

# One row per comparison: NAME | WHAT (the table's first column) | UNIT | castor train flags | PyTorch command (run
# under both policies). ISA=CAP in the flags field runs that side capped (ONEDNN_MAX_CPU_ISA); a PyTorch command
# "castor:FLAGS" compares against Castor itself (the AVX2 guard: O1 against O0 without bf16 units).
rows=(
  "gpt2-124m-O1|GPT-2 124M (B4 T64) O1 bf16|tok/s|--model gpt2 --data brown --batch-size 4 --block-size 64 --eval-iters 1 --amp O1 --steps 24|gpt_torch_bench.py step 124m O1 2 8"
  "gpt2-124m-O0|GPT-2 124M (B4 T64) O0 fp32|tok/s|--model gpt2 --data brown --batch-size 4 --block-size 64 --eval-iters 1 --amp O0 --steps 16|gpt_torch_bench.py step 124m O0 1 5"
  "gpt-char-O1|GPT char model (6x384, B8 T256) O1 bf16|tok/s|--model gpt --data brown-char --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8 --eval-iters 1 --amp O1 --steps 40|gpt_torch_bench.py step char O1 2 10"
  "gpt-char-O0|GPT char model (6x384, B8 T256) O0 fp32|tok/s|--model gpt --data brown-char --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8 --eval-iters 1 --amp O0 --steps 30|gpt_torch_bench.py step char O0 2 8"
  "llama-15m-O1|Llama llama-15m shape (B8 T256, V512) O1 bf16|tok/s|--model llama-15m --data brown-bpe --batch-size 8 --eval-iters 1 --amp O1 --steps 40|llama_torch.py O1 6 8 2 10"
  "simplecnn-O1|SimpleCNN batch 256 O1 bf16|img/s|--model simplecnn --data synthetic --synthetic-size 20480 --optimizer adam --batch-size 256 --amp O1 --steps 60|train_step_torch.py simplecnn 256 3 20 5 2 bf16 bf16_cl"
  "simplecnn-O0|SimpleCNN batch 256 O0 fp32|img/s|--model simplecnn --data synthetic --synthetic-size 20480 --optimizer adam --batch-size 256 --amp O0 --steps 60|train_step_torch.py simplecnn 256 3 20 5 2 fp32 fp32_cl"
  "resnet18-O1|CIFAR ResNet-18 batch 64 O1 bf16|img/s|--model resnet18 --data synthetic --synthetic-size 4096 --optimizer adam --batch-size 64 --amp O1 --steps 20|train_step_torch.py resnet18 64 2 8 5 2 bf16 bf16_cl"
  "resnet18-O0|CIFAR ResNet-18 batch 64 O0 fp32|img/s|--model resnet18 --data synthetic --synthetic-size 4096 --optimizer adam --batch-size 64 --amp O0 --steps 16|train_step_torch.py resnet18 64 2 6 5 2 fp32 fp32_cl"
  "simplecnn-avx2|SimpleCNN batch 256 under the AVX2 cap, O1 bf16 against O0 (guard >= 0.95x)|img/s|ISA=AVX2 --model simplecnn --data synthetic --synthetic-size 20480 --optimizer adam --batch-size 256 --amp O1 --steps 60|castor:ISA=AVX2 --model simplecnn --data synthetic --synthetic-size 20480 --optimizer adam --batch-size 256 --amp O0 --steps 60"
)

# The table from raw lines "ROW SIDE VALUE" (SIDE: castor, other, torch_default, torch_passive; a round's PyTorch figure
# is the faster of its two policies), in the rows' order.
table() {
  local raw=$1
  printf '%s\n' "${rows[@]}" | awk -F'|' -v raw="$raw" '
    function sort(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function stats(list,   a, n) { n = split(list, a, " "); if (!n) return "-"; sort(a, n)
      return sprintf(n == 1 ? "%s" : "%s (%s-%s)", fmt(n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2), fmt(a[1]), fmt(a[n])) }
    function fmt(v) { return v >= 100 ? sprintf("%\047.0f", v) : sprintf("%.2f", v) }
    { order[++rows] = $1; what[$1] = $2; unit[$1] = $3; vs_castor[$1] = index($5, "castor:") == 1 }
    END {
      while ((getline line < raw) > 0) {
        split(line, f, " ")
        if (f[1] == "#") { note = note (note ? "; " : "") substr(line, 3); continue }
        n = ++seen[f[1], f[2]]; val[f[1], f[2], n] = f[3]
      }
      print "| what | Castor (`castor train`) | PyTorch at its best / other side | ratio | rounds |"
      print "|---|---|---|---|---|"
      for (i = 1; i <= rows; i++) {
        r = order[i]; c = t = q = ""
        for (k = 1; k <= seen[r, "castor"]; k++) {
          cv = val[r, "castor", k]; if (cv <= 0) continue  # (a failed run, reported as it came)
          c = c " " cv; ok[r]++
          tv = vs_castor[r] ? val[r, "other", k] : (val[r, "torch_default", k] > val[r, "torch_passive", k] ? val[r, "torch_default", k] : val[r, "torch_passive", k])
          if (tv != "") { t = t " " tv; if (tv > 0) q = q " " cv / tv }
        }
        if (c == "") continue
        printf "| %s | %s %s | %s | %sx | %d |\n", what[r], stats(c), unit[r], stats(t), stats(q), ok[r]
      }
      if (note) print "\n" note
    }'
}

docs_markers=("<!-- bench/all.sh --docs: begin -->" "<!-- bench/all.sh --docs: end -->")
if [ "${1:-}" = --table ] || [ "${1:-}" = --docs ]; then
  [ -r "${2:-}" ] || { echo "all.sh: $1 needs the raw lines of a run (RAW=FILE bench/all.sh ...)" >&2; exit 2; }
  if [ "$1" = --table ]; then table "$2"; exit 0; fi
  doc=$root/docs/benchmarks.md
  grep -qF "${docs_markers[0]}" "$doc" || { echo "all.sh: $doc has no ${docs_markers[0]} marker" >&2; exit 1; }
  new=$(mktemp)
  awk -v begin="${docs_markers[0]}" -v end="${docs_markers[1]}" -v body="$(table "$2")" '
    $0 == begin { print; print body; skip = 1; next } $0 == end { skip = 0 } !skip' "$doc" >"$new"
  mv "$new" "$doc"
  echo "all.sh: wrote the table into $doc" >&2
  exit 0
fi

rounds=${1:-5}
castor=${2:-$root/build/castor}
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -r "$tcmalloc" ] || { echo "all.sh: $tcmalloc missing (apt-get install libtcmalloc-minimal4)" >&2; exit 1; }
[ -x "$castor" ] || { echo "all.sh: $castor is not built (cmake --build build --target castor_cli)" >&2; exit 1; }
renice -n -20 -p $$ >/dev/null 2>&1 || echo "# note: not at nice -20 (renice needs root): both sides at nice $(nice)" >&2
work=$(mktemp -d)
raw=${RAW:-$work/raw}
: >"$raw"
trap 'rm -rf "$work"' EXIT
scale=${STEPS_SCALE:-1}
echo "# CPU: $("$castor" env | sed -n 's/^cpu *//p'); PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), 2 threads, nice $(nice)" | tee -a "$raw"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $rounds rounds, load at the start:$(uptime | sed 's/.*load average://')" | tee -a "$raw"

# castor ROW FLAGS...: one `castor train` run (ISA=CAP first caps it), its steady rate.
castor_rate() {
  local flags=() env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u CASTOR_OPENMP_WAIT)
  for f in "$@"; do
    case $f in
      ISA=*) env+=(ONEDNN_MAX_CPU_ISA="${f#ISA=}") ;;
      *) flags+=("$f") ;;
    esac
  done
  for ((i = 0; i < ${#flags[@]}; i++)); do  # --steps N scaled
    [ "${flags[i]}" = --steps ] && flags[i + 1]=$(awk -v n="${flags[i + 1]}" -v s="$scale" 'BEGIN { n = int(n * s); print n < 5 ? 5 : n }')
  done
  rm -rf "$work/run"
  "${env[@]}" "$castor" train "${flags[@]}" --threads 2 --log-every 100000 --eval-every 0 --keep 1 \
    --out "$work/run" 2>"$work/err" | sed -n 's/.*"train_\(tokens\|images\)_per_sec":\([0-9.e+]*\).*/\2/p' |
    grep . || { echo "all.sh: castor train $* failed: $(tail -1 "$work/err")" >&2; echo 0; }
  rm -rf "$work/run"
}

# torch POLICY COMMAND...: the PyTorch twin (bench/COMMAND) under that OpenMP policy: its best figure.
torch_rate() {
  local policy=$1 script=$2
  shift 2
  local env=(env -u OMP_WAIT_POLICY)
  [ "$policy" = passive ] && env=(env OMP_WAIT_POLICY=passive)
  "${env[@]}" LD_PRELOAD=$tcmalloc /usr/bin/python3 "$here/$script" "$@" |
    awk '{ v = $NF + 0; if (v > best) best = v } END { print best + 0 }'
}

for _ in $(seq "$rounds"); do
  for row in "${rows[@]}"; do
    IFS='|' read -r name _ _ flags other <<<"$row"
    [[ -z "${ONLY:-}" || "$name" == "$ONLY"* ]] || continue
    # shellcheck disable=SC2086  # the flags are words
    echo "$name castor $(castor_rate $flags)" | tee -a "$raw"
    if [[ "$other" == castor:* ]]; then
      # shellcheck disable=SC2086
      echo "$name other $(castor_rate ${other#castor:})" | tee -a "$raw"
    else
      for policy in default passive; do
        # shellcheck disable=SC2086
        echo "$name torch_$policy $(torch_rate $policy $other)" | tee -a "$raw"
      done
    fi
  done
done
echo "# load at the end:$(uptime | sed 's/.*load average://')" | tee -a "$raw"
echo
table "$raw"
