# Sourced by the launcher tests (mpirun_perf.sh, torchrun_perf.sh): check_perf_table OUTPUT
# RANKS checks that loom-perf's output holds one table over RANKS ranks, with a float sum row
# for every size from 8 B to 1 MiB and the result line. Adds to $failures through fail().
check_perf_table() {
  local out=$1 n=$2 r size rows
  for ((r = 0; r < n; r++)); do
    grep -qE "^#  Rank +$r Group" <<<"$out" || fail "the header lists no rank $r"
  done
  [ "$(grep -cE '^#  Rank +[0-9]+ Group' <<<"$out")" -eq "$n" ] ||
    fail "the header does not list exactly $n ranks (one world of $n, not separate runs)"
  for size in 8 1024 1048576; do
    grep -qE "^ +$size +[0-9]+ +float +sum" <<<"$out" || fail "no table row for $size bytes"
  done
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float +sum' <<<"$out")
  [ "$rows" -eq 18 ] || fail "$rows table rows, want 18 (8 B to 1 MiB, doubling, one table)"
  [ "$(grep -c '^# Out of bounds values : 0 OK' <<<"$out")" -eq 1 ] ||
    fail "no single '# Out of bounds values : 0 OK' line"
}
