#!/usr/bin/env bash
# Start-up of `castor train` (issue #30 item 10): wall seconds from launch to the model built (the first line on
# stderr follows it) and to the first step's metrics line, the first step against a steady one (system-call
# timestamps, strace), and the CPU seconds (all threads) spent before the model is built (perf). Needs strace and perf.
#   bench/startup.sh [CASTOR] [-- TRAIN FLAGS]   (default: build/castor, --model gpt2 on Brown, 3 steps of 1 x 64 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
castor=build/castor
if [ $# -gt 0 ] && [ "$1" != -- ]; then castor=$1; shift; fi
[ "${1:-}" = -- ] && shift
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--model gpt2 --data brown --steps 3 --batch-size 1 --block-size 64)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(train "${flags[@]}" --out "$work/run" --log-every 1 --eval-every 0 --eval-iters 1)

strace -f --seccomp-bpf -tt -e trace=execve,write -o "$work/trace" "$castor" "${args[@]}" > /dev/null 2>&1
python3 - "$work/trace" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
def at(line):
    h, m, s = line.split()[1].split(':')
    return int(h) * 3600 + int(m) * 60 + float(s)
launch = at(lines[0])
built = next(at(l) for l in lines if 'write(2, ' in l)
steps = [at(l) for l in lines if 'write(2, "step ' in l]
steady = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else float('nan')
print(f"wall: model built {built - launch:.2f} s, first step done {steps[0] - launch:.2f} s "
      f"(the first step {steps[0] - built:.2f} s, a steady one {steady:.2f} s)")
PY

rm -rf "$work/run"
perf record -q -m 4096 -e cpu-clock -F 999 -e syscalls:sys_enter_write -o "$work/perf" "$castor" "${args[@]}" \
  > /dev/null 2>&1
# (awk reads to the end: an early exit would fail the pipe)
launch=$(perf script -i "$work/perf" -F time 2>/dev/null | awk 'NR == 1 {print $1}' | tr -d ':')
built=$(perf script -i "$work/perf" -F time,event,trace 2>/dev/null |
  awk '/sys_enter_write.*fd: 0x00000002/ && !seen++ {print $1}' | tr -d ':')
count=$(perf report -i "$work/perf" --time "$launch,$built" --stdio -g none 2>/dev/null |
  awk '/^# Event count/ && !seen++ {print $NF}')
echo "cpu: model built $(python3 -c "print(f'{$count / 1e9:.2f}')") s (all threads; load: $(cut -d' ' -f1-3 /proc/loadavg))"
