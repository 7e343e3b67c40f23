#!/usr/bin/env bash
# Quick start 2: install, build, and run the whole test suite.
# LOOM_SANITIZE=1 runs it on an AddressSanitizer + UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
dir=build
[ "${LOOM_SANITIZE:-0}" = 1 ] && dir=build-asan
cd "$dir"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --output-on-failure --timeout 900 "$@"
