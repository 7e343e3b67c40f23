#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang in build-fuzz and runs each for N
# seconds (default 60) from its seeds in tests/fuzz/corpus/<target>, under AddressSanitizer and
# UndefinedBehaviorSanitizer, with a 512 MB RSS and a 256 MB single-allocation limit (so an
# allocation sized by a length field is a finding). Prints the executions per target; exits
# non-zero if any target crashed, leaked, hung or hit a limit. Crashing inputs are kept in
# build-fuzz/artifacts/. Needs clang and libclang-rt-14-dev (scripts/setup.sh installs them).
#   scripts/fuzz.sh [seconds-per-target]      LOOM_FUZZ_JOBS: build parallelism (default nproc)
#   LOOM_FUZZ_PARALLEL: targets run at once (default nproc)
#   LOOM_FUZZ_TARGETS="tcp_frame unique_id": run only these
set -euo pipefail
secs="${1:-60}"
case "$secs" in ''|*[!0-9]*) echo "usage: $0 [seconds-per-target]" >&2; exit 2;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
jobs="${LOOM_FUZZ_JOBS:-$(nproc)}"
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (run scripts/setup.sh)" >&2; exit 2; }
done

# -O1 with line tables: what fuzzing builds commonly use; it compiles in a quarter less time
# than -O2 -g.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_CUDA=OFF \
  -DLOOM_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" >/dev/null
# The targets only (loom_fuzz_targets); make_fuzz_seeds, which rewrites the seeds, is
# built with --target make_fuzz_seeds.
cmake --build "$build" --target loom_fuzz_targets -j "$jobs" >"$build/fuzz-build.log" 2>&1 || {
  tail -40 "$build/fuzz-build.log" >&2
  echo "fuzz.sh: build failed (full log: $build/fuzz-build.log)" >&2
  exit 2
}

all=(unique_id peer_info bootstrap_root bootstrap_reply tcp_handshake tcp_frame topology_xml trace_dump)
targets=(${LOOM_FUZZ_TARGETS:-${all[@]}})
mkdir -p "$build/artifacts" "$build/logs"
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Targets run side by side, LOOM_FUZZ_PARALLEL at a time (default nproc); each writes its row to
# a file, printed in order once all are done.
par="${LOOM_FUZZ_PARALLEL:-$(nproc)}"
run_one() {
  local t=$1 bin="$build/tests/fuzz/${1}_fuzz" seeds="$root/tests/fuzz/corpus/$1"
  local work="$build/corpus/$1" log="$build/logs/$1.log" row="$build/logs/$1.row"
  if [ ! -x "$bin" ]; then
    printf '%-16s %12s %10s %8s  %s\n' "$t" - - - "not built" >"$row"
    return 1
  fi
  mkdir -p "$work"  # new inputs go here, never into the source tree
  local rc=0
  "$bin" -max_total_time="$secs" -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$work" "$seeds" >"$log" 2>&1 || rc=$?
  local execs rate units result=ok
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  units=$(find "$work" -type f | wc -l)
  [ "$rc" -eq 0 ] || result="FAILED (exit $rc; log $log)"
  printf '%-16s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$units" "$result" >"$row"
  return "$rc"
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do wait -n || true; done
  rm -f "$build/logs/$t.row"
  run_one "$t" &
done
wait || true
failed=0
printf '%-16s %12s %10s %8s  %s\n' target executions exec/s corpus result
for t in "${targets[@]}"; do
  row=$(cat "$build/logs/$t.row" 2>/dev/null || printf '%-16s  no result' "$t")
  echo "$row"
  case "$row" in
    *" ok") ;;
    *) failed=1
       grep -E "ERROR|SUMMARY|runtime error|Test unit written|==[0-9]+==" \
                "$build/logs/$t.log" 2>/dev/null | head -20 >&2 || true ;;
  esac
done
exit "$failed"
