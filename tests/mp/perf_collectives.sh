#!/usr/bin/env bash
# loom-perf over every collective, type, op and root, checked element by element against
# bench/perf's reference (exit status 1 on any wrong value); and, where Open MPI is installed,
# the same sweep through MPI, so that the reference itself is checked against another library.
# Also checks the table's shape (a header per collective, the N/A in-place columns of alltoall
# and sendrecv, the -I skew columns), the JSON rows and the footer, and that bad flags exit 2
# with a message naming the flag.
# usage: perf_collectives.sh LOOM_PERF [MPI_PERF]
# Exit status: 0 pass, 1 fail.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 LOOM_PERF [MPI_PERF]" >&2; exit 2; }
perf=$1 mpi_perf=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../check_lib.sh
source "$(dirname "$0")/../check_lib.sh"
colls=(all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter)

for np in 1 3 4; do
  out=$(timeout 300 "$perf" -np "$np" -b 8 -e 64K -f 8 -n 2 -w 1 -C all -d all -o all -r all \
        -J "$tmp/rows.json" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || { echo "$out" | tail -20; fail "loom-perf -np $np exited with $rc"; }
  grep -q '^# Out of bounds values : 0 OK' <<<"$out" || fail "-np $np: footer not OK"
  grep -q '^# Avg bus bandwidth' <<<"$out" || fail "-np $np: no average bus bandwidth line"
  for c in "${colls[@]}"; do
    grep -q "^# Loom [0-9.]*: $c\$" <<<"$out" || fail "-np $np: no table for $c"
  done
  rows=$(grep -c '"collective"' "$tmp/rows.json")
  # 12 types x 5 sizes (8 B to 32 KiB): all_reduce, reduce_scatter 5 ops each, reduce 5 ops x np roots,
  # broadcast, gather and scatter np roots each, all_gather, alltoall and sendrecv 1 each.
  expect=$((12 * 5 * (5 + 5 + 5 * np + 3 * np + 3)))
  [ "$rows" -eq "$expect" ] || fail "-np $np: $rows JSON rows, expected $expect"
done
echo "PASS: every collective, type, op and root on 1, 3 and 4 ranks"

# Table shape: alltoall and sendrecv have no in-place form; -I adds two columns per side.
out=$(timeout 120 "$perf" -np 2 -b 1K -e 1K -C alltoall,sendrecv -I 1 -m 2 -a 3 2>&1)
[ $? -eq 0 ] || fail "-C alltoall,sendrecv -I 1 -m 2 -a 3 failed: $out"
awk '$1 == 1024 {print NF, $(NF-5)}' <<<"$out" | while read -r nf ip; do
  [ "$nf" -eq 17 ] || echo "FAIL: a row has $nf fields, expected 17"
  [ "$ip" = N/A ] || echo "FAIL: in-place time is '$ip', expected N/A"
done | grep FAIL && failures=$((failures + 1))
grep -q 'agg iters: 2' <<<"$out" || fail "-m 2 not in the header"
grep -q 'maxskew' <<<"$out" || fail "-I 1 printed no skew columns"

# Bad flags: exit status 2, the flag named.
for bad in "-C allreduce" "-a 4" "-r x" "-m 0" "-d quad" "-I 2" "-e 18446744073709551615" \
           "-b 0 -e 64K" "-n 1073741824 -I 1"; do
  msg=$("$perf" $bad 2>&1)
  rc=$?
  flag=${bad%% *}
  [ $rc -eq 2 ] && grep -q -- "$flag" <<<"$msg" || fail "'$bad': status $rc, message '$msg'"
done
msg=$("$perf" -C "" 2>&1)
[ $? -eq 2 ] && grep -q -- "-C/--collective: ''" <<<"$msg" || fail "-C '': $msg"
# A root past the run's ranks (known only once the ranks run): refused, not wrapped around.
msg=$(timeout 120 "$perf" -np 2 -r 2 -C broadcast -b 8 -e 8 -n 1 -w 0 2>&1)
[ $? -ne 0 ] && grep -q -- "-r/--root: 2 is not a rank of this run (ranks 0 to 1)" <<<"$msg" ||
  fail "-r 2 on 2 ranks: $msg"
# ... and ignored where no collective of the run has a root, as nccl-tests does.
msg=$(timeout 120 "$perf" -np 2 -r 3 -C all_reduce -b 8 -e 8 -n 1 -w 0 2>&1) ||
  fail "-r 3 with all_reduce only on 2 ranks: $msg"
# Settings out of range or unknown: the run goes on, and each is named in a warning.
msg=$(LOOM_SLOT_BYTES=3 LOOM_FIFO_DEPTH=0 LOOM_KERNEL_ISA=bogus LOOM_DEBUG=loud \
      LOOM_ALGO='allgather:tree' LOOM_SCHEDULE_DUMP=/nonexistent/dir/s.json \
      timeout 120 "$perf" -np 2 -b 8 -e 1K -C all_reduce,all_gather -n 2 -w 1 2>&1)
[ $? -eq 0 ] || fail "a run with settings out of range failed: $msg"
for want in "LOOM_SLOT_BYTES=3 is outside [4096, " "LOOM_FIFO_DEPTH=0 is outside [2, 16]" \
            "LOOM_KERNEL_ISA=bogus" "LOOM_DEBUG=loud" "leaves allgather none of the algorithms" \
            "LOOM_SCHEDULE_DUMP: cannot open"; do
  grep -qF -- "$want" <<<"$msg" || fail "no warning '$want' in: $msg"
done

msg=$("$perf" --help 2>/dev/null)
[ $? -eq 0 ] && grep -q -- "--maxbytes" <<<"$msg" || fail "--help: status or list wrong: '$msg'"

if [ -n "$mpi_perf" ] && [ -x "$mpi_perf" ] && command -v mpirun >/dev/null; then
  out=$(timeout 300 mpirun --allow-run-as-root --oversubscribe -np 3 --mca pml ob1 \
        --mca btl vader,self "$mpi_perf" -b 8 -e 64K -f 8 -n 2 -w 1 -C all -d all -o all -r all 2>&1)
  rc=$?
  [ $rc -eq 0 ] || { echo "$out" | tail -20; fail "mpi-allreduce-perf exited with $rc"; }
  grep -q '^# Out of bounds values : 0 OK' <<<"$out" || fail "MPI: footer not OK"
  echo "PASS: Open MPI agrees with the reference for every collective"
else
  echo "NOTE: Open MPI's benchmark not built or mpirun absent: reference not cross-checked"
fi
[ $failures -eq 0 ] && echo "PASS" && exit 0
echo "$failures failure(s)"
exit 1
