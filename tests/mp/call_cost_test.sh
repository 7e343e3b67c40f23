#!/usr/bin/env bash
# bench/call_cost.sh on 8 B and 4 KiB, few calls: it runs (under callgrind and natively, every
# result checked by the program), each side's layer rows add up to its total (each row rounded
# alone, so within one instruction a row), and the totals are plausible: at least hundreds of
# instructions a call, at most ten million (the callgrind side is counted while it waits, and
# where the native peer is descheduled, as under ctest's parallel runs, it spins for it: one
# such run counted Open MPI's 4 KiB call at 188 thousand). Exit 0 pass, 1 fail, 77 skip.
# Usage: call_cost_test.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
out=$("$src/bench/call_cost.sh" -s 8,4096 -n 2000 -i 50 -r 1 "$build" 2>&1)
rc=$?
echo "$out"
((rc == 77)) && exit 77
((rc == 0)) || { echo "FAIL: call_cost.sh exited $rc"; exit 1; }
status=0
for side in "Loom" "Open MPI"; do
  grep -q "^| \*\*$side: instructions per call" <<<"$out" || {
    [[ $side == "Open MPI" ]] && continue
    echo "FAIL: no $side total"; exit 1
  }
  for col in 2 3; do
    awk -F'|' -v side="$side" -v col="$col" '
      index($2, " " side ": ") == 1 && $2 !~ /\*\*/ { n++; sum += $(col + 1) }
      index($2, " **" side ": instructions per call**") == 1 { t = $(col + 1); gsub(/[* ]/, "", t); t += 0 }
      END {
        if (t < 100 || t > 10000000) { printf "FAIL: %s total %s out of range\n", side, t; exit 1 }
        if (sum < t - n || sum > t + n) { printf "FAIL: %s rows add to %d, total %d\n", side, sum, t; exit 1 }
        printf "%s column %d: %d rows add to %d (total %d)\n", side, col, n, sum, t
      }' <<<"$out" || status=1
  done
done
exit $status
