#!/usr/bin/env bash
# Configures and builds Loom into ./build (extra arguments go to cmake).
# LOOM_SANITIZE=1 builds with AddressSanitizer and UndefinedBehaviorSanitizer
# into ./build-asan instead; LOOM_SANITIZE=thread with ThreadSanitizer into ./build-tsan.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [ "${LOOM_SANITIZE:-0}" = 1 ]; then
  dir=build-asan
  args+=(-DLOOM_SANITIZE=address,undefined)
elif [ "${LOOM_SANITIZE:-0}" = thread ]; then
  dir=build-tsan
  args+=(-DLOOM_SANITIZE=thread)
fi
cmake -S . -B "$dir" "${args[@]}" "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)"
