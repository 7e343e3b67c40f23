#!/usr/bin/env bash
# loom-trace on dumps of real ranks of the real library (trace_ranks.cc):
#  1. rank 2 sleeps 20 ms before every 5th of 40 all-reduces: it heads the
#     straggler table, last at least 8 times, its lateness in those operations
#     about 20 ms (the median; a busy machine may stretch one sleep), and the
#     waiting it caused at least 8 x 20 ms per other rank;
#  2. rank 2 of 3 skips an all-reduce, the others' last one times out: seq 6 is
#     reported with rank 2 missing (exit 3), and rank 0's timeout names the operation, rank 2
#     and rank 2's last completed operation; again on the ring schedule, where it also names
#     the step;
#  3. rank 1 calls a broadcast where the others call an all-reduce: a mismatch
#     at seq 3 (exit 4);
#  4. the direct all-reduce with rank 2 entering every second of 20 operations 20 ms late
#     (LOOM_INJECT_DELAY): the data table has every sender's first data at both receivers in
#     every operation, rank 2 holds the others' longest waits with at least 10 x 2 x 16 ms
#     waited on it, and its data, less its lateness, is not mistaken for a slow link.
#   trace_e2e_test.sh TRACE_RANKS_BINARY LOOM_TRACE_BINARY
set -u
ranks=$1
tool=$2
. "$(dirname "$0")/trace_test_lib.sh"

# run NAME NRANKS: the scenario's ranks, then loom-trace over their dumps.
run() {
  mkdir -p "$work/$1"
  if ! "$ranks" "$1" "$2" "$work/$1" >"$work/$1.ranks" 2>&1; then
    fail "$1: the ranks failed:"
    cat "$work/$1.ranks"
  fi
  "$tool" "$work/$1" --html "$work/$1.html" --perfetto "$work/$1.perfetto.json" \
    >"$work/$1.txt" 2>&1
  rc=$?
  echo "--- loom-trace on scenario $1 (exit $rc)"
  cat "$work/$1.txt"
}

# 1. The straggler.
run straggler 3
[ "$rc" -eq 0 ] || fail "straggler: exit $rc, expected 0"
# The table is sorted by wait caused: its first row is the worst straggler.
read -r rank ops last mean p99 max wait < <(awk '/^  rank +ops/ { getline; print; exit }' \
  "$work/straggler.txt")
[ "${rank:-}" = 2 ] || fail "straggler: the table's first rank is ${rank:-none}, expected 2"
[ "${ops:-0}" -eq 40 ] || fail "straggler: ${ops:-0} operations timed, expected 40"
[ "${last:-0}" -ge 8 ] || fail "straggler: rank 2 last ${last:-0} times, expected at least 8"
awk -v m="${max:-0}" 'BEGIN { exit !(m >= 17000) }' ||
  fail "straggler: max lateness ${max:-?} us, expected at least 17 ms"
# Two others waited about 20 ms in each of 8 operations.
awk -v w="${wait:-0}" 'BEGIN { exit !(w >= 0.8 * 2 * 8 * 20000) }' ||
  fail "straggler: wait caused ${wait:-?} us, expected at least 256000"
# Every other rank caused far less waiting.
awk -v w="${wait:-0}" '/^  rank +ops/ { on = 1; next } on && NF == 7 && $1 != 2 && $7 > w / 4 { bad = 1 }
     /^  slowest/ { on = 0 } END { exit bad }' "$work/straggler.txt" ||
  fail "straggler: another rank caused over a quarter of rank 2's waiting"
# The lateness of the sleeping operations (seq 5, 10, ..., 40) from the trace's slices: the
# median, so that one sleep stretched by a busy machine does not decide, is about 20 ms.
median=$(grep -oE '"lateness_us":[0-9.e+-]+,"op":"[a-z]+","proto":"[A-Za-z]*","seq":[0-9]+' \
  "$work/straggler.perfetto.json" |
  sed -E 's/"lateness_us":([^,]*),.*"seq":([0-9]+)/\2 \1/' |
  awk '$1 % 5 == 0 && $2 > late[$1] { late[$1] = $2 } END { for (s in late) print late[s] }' |
  sort -g | awk '{ v[NR] = $1 } END { print NR == 8 ? (v[4] + v[5]) / 2 : -1 }')
awk -v m="${median:--1}" 'BEGIN { exit !(m >= 17000 && m <= 45000) }' ||
  fail "straggler: median lateness of the sleeping operations ${median:-?} us, expected 20 ms"
echo "median lateness of the sleeping operations: $median us"
grep -q "slowest: rank 2," "$work/straggler.txt" || fail "straggler: rank 2 not named slowest"
slices=$(grep -o '"ph":"X"' "$work/straggler.perfetto.json" | wc -l)
[ "$slices" -eq 120 ] || fail "straggler: $slices trace slices, expected 3 x 40"
grep -q 'id="heatmap"' "$work/straggler.html" || fail "straggler: no heatmap in the page"

# 2. A rank skips an operation.
run skip 3
[ "$rc" -eq 3 ] || fail "skip: exit $rc, expected 3 (missing)"
grep -qF "seq 6 allreduce: missing ranks: {2} (entered by {0,1})" "$work/skip.txt" ||
  fail "skip: rank 2 not reported missing at seq 6"
grep -qF "rank 2: last seq 5 allreduce completed" "$work/skip.txt" ||
  fail "skip: rank 2's last operation not shown"
grep -qE 'error on rank 0: ".*allreduce #6 timed out after [0-9]+ ms waiting for rank 2 .*rank 2 last completed operation #5"' \
  "$work/skip.txt" || fail "skip: rank 0's timeout does not name allreduce #6, rank 2 and its last operation #5"

# 2b. The same skip on the ring schedule (LOOM_ALGO=ring; the ranks inherit it): the others'
# timeout names the operation and its sequence number, the step, the peer waited for and that
# peer's last completed operation, and loom-trace shows it beside rank 2 missing.
mkdir -p "$work/skipring"
LOOM_ALGO=ring "$ranks" skip 3 "$work/skipring" >"$work/skipring.ranks" 2>&1 ||
  { fail "skipring: the ranks failed:"; cat "$work/skipring.ranks"; }
"$tool" "$work/skipring" >"$work/skipring.txt" 2>&1
rc=$?
echo "--- loom-trace on scenario skip with LOOM_ALGO=ring (exit $rc)"
cat "$work/skipring.txt"
[ "$rc" -eq 3 ] || fail "skipring: exit $rc, expected 3 (missing)"
grep -qF "seq 6 allreduce: missing ranks: {2} (entered by {0,1})" "$work/skipring.txt" ||
  fail "skipring: rank 2 not reported missing at seq 6"
# Rank 0 receives from rank 2 on the ring: its error is the one shown (the lowest failed rank).
grep -qE 'error on rank 0: ".*allreduce #6 timed out after [0-9]+ ms waiting for rank 2 \(receiving, [A-Za-z]+, step [0-9]+ of [0-9]+, piece [0-9]+ of [0-9]+\); rank 2 last completed operation #5"' \
  "$work/skipring.txt" ||
  fail "skipring: rank 0's timeout does not name allreduce #6, the step, rank 2 and its last operation #5"

# 3. Different collectives at one sequence number.
run mismatch 3
[ "$rc" -eq 4 ] || fail "mismatch: exit $rc, expected 4"
grep -qF "mismatch at seq 3: ranks {0,2} allreduce count 256 fp32 sum, rank 1 broadcast count 256 fp32 root 0" \
  "$work/mismatch.txt" || fail "mismatch: not reported at seq 3"

# 4. First arrivals on the direct path.
run direct 3
[ "$rc" -eq 0 ] || fail "direct: exit $rc, expected 0"
grep -qF '"algorithm":"direct"' "$work/direct/"*rank0*.json || fail "direct: not the direct path"
senders=$(awk '/^  rank arrivals/ { on = 1; next } on && NF == 7 && $2 == 40 { n++ }
               /^  slowest data/ { on = 0 } END { print n + 0 }' "$work/direct.txt")
[ "$senders" -eq 3 ] || fail "direct: $senders senders with 2 x 20 first arrivals, expected 3"
read -r rank arrivals mean p99 max waits waited < <(awk '/^  rank arrivals/ { on = 1; next }
  on && NF == 7 && $1 == 2 { print; exit }' "$work/direct.txt")
[ "${rank:-}" = 2 ] || fail "direct: rank 2 missing from the data table"
# Ranks 0 and 1 each wait longest on rank 2 in its 10 late operations: 20, less one per rank for
# an operation where the other was descheduled longer (a loaded 2-core machine).
[ "${waits:-0}" -ge 18 ] || fail "direct: ${waits:-0} longest waits on rank 2, expected at least 18"
awk -v w="${waited:-0}" 'BEGIN { exit !(w >= 0.8 * 20 * 20000) }' ||
  fail "direct: ${waited:-?} us waited on rank 2, expected at least 320000"
awk -v m="${mean:-99999}" 'BEGIN { exit !(m < 10000) }' ||
  fail "direct: rank 2's data delay ${mean:-?} us: its lateness taken for a slow link"

finish
