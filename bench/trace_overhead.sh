#!/usr/bin/env bash
# The flight recorder's cost, two ways:
#  1. loom-trace-overhead (bench/trace_overhead.cc): two ranks with recording off
#     (LOOM_FLIGHT_RECORDER=0) and two with it on take turns in many short batches of 8 B and
#     1 MiB all-reduces; per size the medians, the median paired difference with a 95 %
#     bootstrap interval, and PASS / UNSURE / FAIL against the targets (under 0.5 us at 8 B,
#     under 2 % at 1 MiB). Over shared memory and over TCP (LOOM_SHM_DISABLE=1).
#  2. loom-recorder-bench (bench/recorder_bench.cc): the recorder's own calls per operation,
#     timed in a loop; no other process is involved, so the machine's load barely moves it.
#
#   bench/trace_overhead.sh [BUILD_DIR] [REPS]      (defaults: build, 400)
set -u

BUILD=${1:-build}
REPS=${2:-400}
[[ -x "$BUILD/loom-trace-overhead" ]] ||
  { echo "usage: $0 [build directory holding loom-trace-overhead] [repetitions]" >&2; exit 2; }
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { echo "repetitions must be a positive integer, got '$REPS'" >&2; exit 2; }

status=0
echo "# $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
for transport in shm tcp; do
  "$BUILD/loom-trace-overhead" -t "$transport" -r "$REPS" || status=1
done
if [[ -x "$BUILD/loom-recorder-bench" ]]; then
  "$BUILD/loom-recorder-bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true ||
    status=1
else
  echo "# loom-recorder-bench not built (Google Benchmark missing)"
fi
exit $status
