#!/usr/bin/env bash
# Quick start 1: install, build, and run the all-reduce benchmark on local ranks.
# Extra arguments go to loom-perf (default: 2 ranks, 8 B to 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
if [ $# -eq 0 ]; then set -- -np 2 -b 8 -e 64M -f 4; fi
exec ./build/loom-perf "$@"
