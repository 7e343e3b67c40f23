# Sourced by loom-trace's test scripts: a scratch folder ($work, removed on
# exit), `fail MESSAGE` to count a failed check, and `finish` to end with the
# verdict.
work=$(mktemp -d /tmp/loom-trace-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
