#!/usr/bin/env bash
# Quick start 2: install, check that the sources match .clang-format (scripts/check_format.sh),
# build, and run the whole test suite, then a short fuzzing run of every wire parser
# (LOOM_FUZZ_SECONDS per target, default 10; 0 skips it), then the unit and
# multi-process suites on an AddressSanitizer + UndefinedBehaviorSanitizer build
# (scripts/sanitize.sh; LOOM_SANITIZE_CHECK=0 skips it, =thread runs ThreadSanitizer's set too).
# LOOM_SANITIZE=1 runs the whole suite on an AddressSanitizer + UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's wall time, printed at the end (or where a step fails): CI has 30 minutes.
times=()
timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  times+=("$name $((SECONDS - start)) s")
}
trap 'echo "test.sh: ${times[*]/%/;} total $SECONDS s"' EXIT
timed setup ./scripts/setup.sh
timed format ./scripts/check_format.sh
# The CUDA sources (where nvcc exists) are built as compute_90 PTX only, to keep the suite's
# build short; a GPU machine builds its real architectures (tests/gpu/run.sh).
timed build ./scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES="${LOOM_CUDA_ARCHS:-90-virtual}"
dir=build
[ "${LOOM_SANITIZE:-0}" = 1 ] && dir=build-asan
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Label sanitize marks the sanitizer run's smaller stand-ins (scripts/sanitize.sh).
# LOOM_TEST_JOBS tests at once (default nproc): most multi-process tests spend much of their
# time waiting on peers or timeouts, so two at a time on 2 cores took 196 s against 295 s.
export LOOM_TEST_JOBS=${LOOM_TEST_JOBS:-$(nproc)}
run_ctest() {
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j "$LOOM_TEST_JOBS" -LE '^sanitize$' "$@")
}
timed ctest run_ctest "$@"
fuzz_s=${LOOM_FUZZ_SECONDS:-10}
if [ "$fuzz_s" != 0 ]; then
  LOOM_FUZZ_JOBS=${LOOM_FUZZ_JOBS:-2} timed fuzz ./scripts/fuzz.sh "$fuzz_s"
fi
case "${LOOM_SANITIZE_CHECK:-1}" in
  0) ;;
  thread) LOOM_SANITIZE_JOBS=${LOOM_SANITIZE_JOBS:-2} timed asan ./scripts/sanitize.sh address,undefined
          LOOM_SANITIZE_JOBS=${LOOM_SANITIZE_JOBS:-2} timed tsan ./scripts/sanitize.sh thread ;;
  *) LOOM_SANITIZE_JOBS=${LOOM_SANITIZE_JOBS:-2} timed asan ./scripts/sanitize.sh address,undefined ;;
esac
