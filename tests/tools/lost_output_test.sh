#!/usr/bin/env bash
# The command-line tools fail (exit status 1, naming the tool on standard error) when what they
# write to standard output is lost: each runs once into /dev/full, and once into /dev/null,
# where the same run succeeds.
#   lost_output_test.sh LOOM_ENV LOOM_TOPO LOOM_TRACE TRACE_FIXTURES LOOM_PERF
# A tool this build lacks is given as "-" and not run.
set -u
env_tool=$1 topo=$2 trace=$3 fixtures=$4 perf=$5
failures=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# check NAME TOOL ARGS...
check() {
  local name=$1
  shift
  "$@" >/dev/null 2>"$err"
  local ok=$?
  "$@" >/dev/full 2>"$err"
  local lost=$?
  if [ "$ok" -ne 0 ]; then
    echo "FAIL $name: exit $ok into /dev/null"
    cat "$err"
    failures=$((failures + 1))
  elif [ "$lost" -ne 1 ] || ! grep -q "^$(basename "$1"): writing standard output: " "$err"; then
    echo "FAIL $name: exit $lost into /dev/full, expected 1 and the tool naming the lost output:"
    cat "$err"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(head -1 "$err")"
  fi
}

check "loom-env's table" "$env_tool"
if [ "$topo" != - ]; then
  check "loom-topo's report" "$topo"
  check "loom-topo --help" "$topo" --help
fi
if [ "$trace" != - ]; then
  check "loom-trace's report" "$trace" "$fixtures/straggler"
  check "loom-trace --help" "$trace" --help
fi
if [ "$perf" != - ]; then
  check "loom-perf --help" "$perf" --help
  check "loom-perf's table (2 ranks)" "$perf" -np 2 -b 8 -e 64 -f 2 -n 5 -w 1
fi
[ "$failures" -eq 0 ] && echo "all passed" && exit 0
echo "$failures failed"
exit 1
