#!/usr/bin/env bash
# Four hosts x two ranks (and once 5 ranks, unevenly) in network namespaces on a bridge (bench/multihost/hosts.sh):
# loom-perf's all-reduce with LOOM_ALGO=hier, hierrd, tree and rhd, every result checked
# (loom-perf exits 1 on a wrong value), so the cross-host schedules run across real
# processes: shared memory inside a host, TCP between hosts. Also checks that the
# communicator merged the four hosts into one system graph, that LOOM_TOPO_DISABLE=1 runs
# without one, that each forced run used the algorithm it named, and that the library's
# tuner predicts what loom-topo prints for the same layout.
# Usage: multihost.sh path/to/loom-perf path/to/loom-topo. Exit 0 pass, 1 fail, 77 skip.
set -u
PERF=${1:-}
TOPO=${2:-}
[[ -x $PERF && -x $TOPO ]] || { echo "usage: $0 path/to/loom-perf path/to/loom-topo" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../bench/multihost/hosts.sh
source "$HERE/../../bench/multihost/hosts.sh"
LOGS=$(mktemp -d /tmp/loom_multihost_test.XXXXXX)
trap 'mh_cleanup; rm -rf "$LOGS"' EXIT
HOSTS=4
NRANKS=8
export MH_RANK_TIMEOUT_S=60
START=$(date +%s)
mh_setup $HOSTS "" "" || { echo "namespace set-up failed"; exit 1; }
status=0
fail() {
  echo "FAIL: $*"
  status=1
}

# One checked run; $1 names it, $2 the extra variables of every rank, $3 rank 0's.
run() {
  local name=$1 every=$2 first=$3 r
  mkdir -p "$LOGS/$name"
  for ((r = 0; r < NRANKS; ++r)); do
    printf -v "MH_ENV_$r" '%s' "LOOM_TIMEOUT_MS=30000 $every $( ((r == 0)) && echo "$first")"
  done
  mh_run $NRANKS "$LOGS/$name" "$PERF" -C all_reduce -b 8 -e 1M -f 8 -n 1 -w 0 -c 1 \
    -d float -o sum || { fail "$name: ranks failed"; return 1; }
  grep -q "Out of bounds values : 0 OK" "$LOGS/$name/rank0.log" ||
    fail "$name: rank 0 reports wrong values"
  echo "$name: $(grep -c '^ *[0-9]' "$LOGS/$name/rank0.log") sizes checked"
}

for algo in hier hierrd tree rhd; do
  run "$algo" "LOOM_ALGO=allreduce:$algo LOOM_SCHEDULE_DUMP=$LOGS/$algo/schedules.json" \
    "LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TOPO LOOM_DEBUG_FILE=$LOGS/$algo/topo.log" || continue
  # Every schedule built was the forced algorithm's (the dump is shared by all ranks).
  n=$(grep -c '"algorithm"' "$LOGS/$algo/schedules.json" 2>/dev/null)
  other=$(grep -o '"algorithm": *"[a-z]*"' "$LOGS/$algo/schedules.json" | grep -vc "\"$algo\"")
  ((n > 0 && other == 0)) || fail "$algo: $n schedules dumped, $other of another algorithm"
  grep -q "system graph: $HOSTS host(s)" "$LOGS/$algo/topo.log" ||
    fail "$algo: rank 0 did not merge $HOSTS hosts into its system graph"
done

# Without a graph the communicator still works.
run topo-disabled "LOOM_TOPO_DISABLE=1" \
  "LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TOPO LOOM_DEBUG_FILE=$LOGS/topo-disabled/topo.log" &&
  { grep -q "no system graph" "$LOGS/topo-disabled/topo.log" ||
    fail "LOOM_TOPO_DISABLE=1: rank 0 did not say it runs without a graph"; }

# Hosts of unequal rank counts (5 ranks on 4 hosts: two on the first, one on each other), a
# layout that once hung in set-up: a rank with no local peer ran fewer of the communicator's
# barriers in its shared-memory set-up than the ranks that have one.
NRANKS=5
run uneven "" ""
NRANKS=8

# The library's tuner (rank 0's TUNE log) predicts what loom-topo prints for 4 x 2.
if run tuner "" "LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNE LOOM_DEBUG_FILE=$LOGS/tuner/tune.log"; then
  # Every namespace shares this machine's cores, which the communicator counts (ranks per core).
  table=$("$TOPO" --no-paths --hosts $HOSTS --ranks-per-host 2 --min-bytes 8 --max-bytes 1048576 \
          --factor 8 --ranks-per-core $(((NRANKS + $(nproc) - 1) / $(nproc))) 2>/dev/null | awk '/^predicted /{on=1; next} on && NF')
  # Internal all-reduces (loomBarrier's byte, loom-perf's 8-byte sums) log predictions for
  # other element sizes, so each (size, algorithm) of loom-topo's table must match one of
  # the library's predictions for that size, and every one must be found.
  compared=$(echo "$table" | awk -v logf="$LOGS/tuner/tune.log" '
    NR == 1 { for (i = 2; i < NF; ++i) name[i] = $i; next }
    # "-": an algorithm not offered at that size (rd above its limit), so not priced.
    { for (i = 2; i < NF; ++i) if ($i != "-") topo[$1 " " name[i]] = $i }
    END {
      while ((getline line < logf) > 0)
        if (match(line, /allreduce of [0-9]+ bytes: [a-z]+ predicted [0-9.]+ us/)) {
          split(substr(line, RSTART, RLENGTH), w, " ")
          key = w[3] " " w[5]
          lib[key] = lib[key] " " sprintf("%.1f", w[7])
        }
      for (key in topo) {
        ++n
        if (index(lib[key] " ", " " topo[key] " ") == 0) {
          print "MISMATCH " key ": loom-topo " topo[key] ", library" (lib[key] == "" ? " none" : lib[key])
          bad = 1
        }
      }
      print n + 0
      exit bad
    }') || fail "tuner predictions differ from loom-topo's: $compared"
  ((${compared##*$'\n'} >= 24)) || fail "only ${compared##*$'\n'} tuner predictions compared"
  echo "tuner: ${compared##*$'\n'} predictions equal to loom-topo's"
fi
echo "multihost: $( ((status == 0)) && echo PASS || echo FAIL ) after $(($(date +%s) - START)) s"
exit $status
