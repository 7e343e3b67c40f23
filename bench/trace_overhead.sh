#!/usr/bin/env bash
# The flight recorder's cost: loom-perf's all-reduce with recording off (LOOM_FLIGHT_RECORDER=0)
# and on (the default, 2000 records), at 8 B and 1 MiB, two ranks over shared memory and two
# over TCP (LOOM_SHM_DISABLE=1). Off and on alternate within each repetition (their order
# flips every repetition) so that drift in the machine's load hits both alike; the best time of
# each is compared. Prints every run's time, then per case the best and the spread (best..worst)
# of each mode and the cost: microseconds at 8 B (target under 0.5 us), percent at 1 MiB
# (target under 2 %).
#
#   bench/trace_overhead.sh [LOOM_PERF] [REPS]
# Environment: ITERS_SMALL (default 2000) and ITERS_LARGE (200) timed iterations per run,
# warm-up a tenth of that.
set -u

PERF=${1:-build/loom-perf}
REPS=${2:-5}
ITERS_SMALL=${ITERS_SMALL:-2000}
ITERS_LARGE=${ITERS_LARGE:-200}
[[ -x "$PERF" ]] || { echo "usage: $0 [path/to/loom-perf] [repetitions]" >&2; exit 2; }
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { echo "repetitions must be a positive integer, got '$REPS'" >&2; exit 2; }

# one_run TRANSPORT BYTES RECORDER: prints rank 0's out-of-place time in us.
one_run() {
  local transport=$1 bytes=$2 recorder=$3 iters=$ITERS_SMALL
  ((bytes > 4096)) && iters=$ITERS_LARGE
  local -a envs=(LOOM_FLIGHT_RECORDER="$recorder")
  [[ $transport == tcp ]] && envs+=(LOOM_SHM_DISABLE=1 LOOM_SOCKET_IFNAME=lo)
  env "${envs[@]}" "$PERF" -np 2 -b "$bytes" -e "$bytes" -n "$iters" -w $((iters / 10 + 1)) \
    -c 1 2>&1 | awk -v b="$bytes" '$1 == b && NF >= 9 { print $6; found = 1 }
                                     END { if (!found) print "error" }'
}

# stats FILE: "best median worst" of the numbers in FILE.
stats() {
  sort -g "$1" | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                                         print v[1], m, v[NR] }'
}

work=$(mktemp -d /tmp/loom-trace-overhead.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "# $("$PERF" -np 1 -b 8 -e 8 -n 1 -w 0 2>&1 | head -1 | sed 's/^# //'); $REPS repetitions," \
  "$ITERS_SMALL iterations at 8 B, $ITERS_LARGE at 1 MiB; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for transport in shm tcp; do
  for bytes in 8 1048576; do
    : >"$work/off" && : >"$work/on"
    for rep in $(seq "$REPS"); do
      order="0 2000"
      ((rep % 2 == 0)) && order="2000 0"
      for recorder in $order; do
        t=$(one_run "$transport" "$bytes" "$recorder")
        if [[ $t == error ]]; then
          echo "ERROR: loom-perf failed: $transport $bytes B, recorder $recorder"
          continue
        fi
        mode=$([[ $recorder == 0 ]] && echo off || echo on)
        echo "$t" >>"$work/$mode"
        echo "run: $transport $bytes B recorder $mode rep $rep: $t us"
      done
    done
    [[ -s "$work/off" && -s "$work/on" ]] || continue
    read -r offBest offMed offWorst < <(stats "$work/off")
    read -r onBest onMed onWorst < <(stats "$work/on")
    if ((bytes == 8)); then
      cost=$(awk -v a="$onBest" -v b="$offBest" 'BEGIN { printf "%+.2f us (target < 0.5 us)", a - b }')
    else
      cost=$(awk -v a="$onBest" -v b="$offBest" 'BEGIN { printf "%+.2f %% (target < 2 %%)", (a / b - 1) * 100 }')
    fi
    printf "RESULT %-4s %8s B  off %9s us (median %s, worst %s)  on %9s us (median %s, worst %s)  cost %s\n" \
      "$transport" "$bytes" "$offBest" "$offMed" "$offWorst" "$onBest" "$onMed" "$onWorst" "$cost"
  done
done | tee "$work/log"
echo "summary (best, median and worst of each mode; the cost compares the best):"
grep "^RESULT" "$work/log" | sed 's/^RESULT /  /'
! grep -q "^ERROR" "$work/log"
