#!/usr/bin/env bash
# loom-trace's command line on the fixtures of tests/data/trace (written by
# make_trace_fixtures.py): each situation's exit code and the line that names
# it; usage errors; unwritable outputs; --comm.
#   trace_cli_test.sh LOOM_TRACE_BINARY FIXTURE_DIR
set -u
tool=$1
data=$2
. "$(dirname "$0")/trace_test_lib.sh"

# expect NAME CODE PATTERN ARGS...: runs loom-trace ARGS, checks the exit code
# and that stdout+stderr hold PATTERN (a fixed string).
expect() {
  local name=$1 code=$2 pattern=$3
  shift 3
  "$tool" "$@" >"$work/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$code" ]; then
    fail "$name: exit $rc, expected $code"
    cat "$work/out"
  elif ! grep -qF -- "$pattern" "$work/out"; then
    fail "$name: no \"$pattern\" in:"
    cat "$work/out"
  else
    echo "ok   $name"
  fi
}

expect straggler 0 "slowest: rank 3, last in" "$data/straggler"
expect straggler-verdict 0 "Verdict: consistent (exit 0)" "$data/straggler"
expect missing 3 "seq 8 allreduce: missing ranks: {1} (entered by {0,2})" "$data/missing"
expect missing-failed 3 "failed on ranks {0,2}" "$data/missing"
expect mismatch 4 \
  "mismatch at seq 4: rank 0 allreduce count 1024 fp32 sum, rank 1 broadcast count 1024 fp32 root 0" \
  "$data/mismatch"
expect stuck 5 "seq 6 allreduce: stuck in started on ranks {2} while ranks {0,1} completed" \
  "$data/stuck"
expect incomplete 6 "no dump from ranks {2}" "$data/incomplete"
expect malformed 2 "malformed/loom-trace-00000000f1f1f1f1-rank1.json: not valid JSON" \
  "$data/malformed"
# Files named one by one and a folder: three communicators; the most specific finding wins.
expect files 4 "mismatch at seq 4" "$data/mismatch/loom-trace-00000000f1f1f1f1-rank0.json" \
  "$data/mismatch/loom-trace-00000000f1f1f1f1-rank1.json" "$data/twocomms"
expect two-comms 0 'communicator "model" (hash 000000000000aaaa): 2 ranks' "$data/twocomms"
expect comm-by-name 0 'communicator "data"' "$data/twocomms" --comm data
expect comm-by-hash 0 'communicator "model"' "$data/twocomms" --comm=000000000000aa
expect comm-unknown 1 'no communicator named "nope"' "$data/twocomms" --comm nope
expect no-input 1 "no dump folder or file given"
expect unknown-option 1 "unknown option --frobnicate" "$data/straggler" --frobnicate
expect no-value 1 "--html needs a value" "$data/straggler" --html
expect absent-file 2 "absent.json: cannot open" "$data/absent.json"
expect max-findings-negative 1 '--max-findings takes a whole number, not "-1"' "$data/straggler" \
  --max-findings -1
expect max-findings-plus 1 '--max-findings takes a whole number, not "+3"' "$data/straggler" \
  --max-findings=+3
expect max-findings-zero 0 "Verdict: consistent (exit 0)" "$data/straggler" --max-findings 0
expect html-empty 1 "--html takes a file name, not an empty one" "$data/straggler" --html=
expect perfetto-empty 1 "--perfetto takes a file name, not an empty one" "$data/straggler" \
  --perfetto ""
expect comm-empty 1 "--comm takes a communicator name or hash, not an empty one" \
  "$data/straggler" --comm ""
expect help 0 "usage: loom-trace" --help
expect unwritable 1 "cannot write /nonexistent-dir/x.html" "$data/straggler" \
  --html /nonexistent-dir/x.html

# A state the tool does not know is bad input naming the operation and the field, not "stuck".
mkdir "$work/state"
cp "$data"/stuck/*.json "$work/state/"
sed -i 's/"state":"started"/"state":"running"/' "$work/state/loom-trace-00000000f1f1f1f1-rank2.json"
expect unknown-state 2 \
  'loom-trace-00000000f1f1f1f1-rank2.json: ops[5]: "state" is "running", not enqueued, started' \
  "$work/state"
rm -rf "$work/state"

# A report written into the dump folder is skipped on the next run.
cp "$data"/stuck/*.json "$work/"
expect perfetto-in-folder 5 "stuck in started" "$work" --perfetto "$work/trace.json"
expect perfetto-skipped 5 "note: skipped $work/trace.json: not a Loom trace dump" "$work"

finish
