# Sourced by the shell tests: fail MESSAGE prints "FAIL: MESSAGE" and counts it in $failures,
# which sourcing sets to 0; a test ends with [ $failures -eq 0 ] (or its own summary).
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
