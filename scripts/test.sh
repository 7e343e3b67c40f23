#!/usr/bin/env bash
# Quick start 2: install, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
