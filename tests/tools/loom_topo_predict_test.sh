#!/usr/bin/env bash
# loom-topo's predicted-time table: its shape, that the tuner's choice on every row is the
# cheapest prediction among the algorithms LOOM_ALGO allows, that predictions grow with the
# size, that trees and hierarchies beat the flat ring for small messages across hosts, and
# that bad arguments are refused with a message naming them.
# Usage: loom_topo_predict_test.sh path/to/loom-topo path/to/topology.xml
set -u
TOPO=$1
FILE=$2
fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

# The table's rows, as "bytes t1 t2 ... choice", after the "predicted" line; first line the header.
table() {
  "$TOPO" --file "$FILE" --no-paths "$@" | awk '/^predicted /{on=1; next} on && NF' 
}

# Checks a table: every row has one number per algorithm column and a known choice; sizes go
# up by the factor; each column never shrinks as sizes grow; the choice is the first column
# (in header order) with the least time among `allowed` (a space-separated list, or "all").
check() {
  local what=$1 allowed=$2 rows=$3 first=$4 factor=$5
  shift 5
  local out
  out=$(table "$@") || { bad "$what: loom-topo failed"; return; }
  echo "$out" | awk -v what="$what" -v allowed="$allowed" -v rows="$rows" -v first="$first" \
                    -v factor="$factor" '
    NR == 1 {
      if ($1 != "bytes" || $NF != "choice") { print "FAIL: " what ": header " $0; bad = 1 }
      ncol = NF - 2
      for (i = 2; i < NF; ++i) name[i] = $i
      next
    }
    {
      ++n
      if (NF != ncol + 2) { print "FAIL: " what ": row has " NF " fields: " $0; bad = 1; next }
      want = (n == 1) ? first : prev * factor
      if ($1 != want) { print "FAIL: " what ": size " $1 ", expected " want; bad = 1 }
      prev = $1
      best = ""
      for (i = 2; i < NF; ++i) {
        # "-": not offered at this size (rd above its limit); never before a number.
        if ($i == "-") { gone[i] = 1; continue }
        if (gone[i]) { print "FAIL: " what ": " name[i] " offered again at " $1 " B"; bad = 1 }
        if ($i !~ /^[0-9]+\.[0-9]$/ || $i + 0 <= 0) { print "FAIL: " what ": bad time " $i; bad = 1 }
        if (n > 1 && $i + 0 < last[i]) {
          print "FAIL: " what ": " name[i] " predicted faster at " $1 " B than at a smaller size"
          bad = 1
        }
        last[i] = $i + 0
        ok = allowed == "all" || index(" " allowed " ", " " name[i] " ") > 0
        if (ok && (best == "" || $i + 0 < bestUs)) { best = name[i]; bestUs = $i + 0 }
      }
      if ($NF != best) { print "FAIL: " what ": at " $1 " B the choice is " $NF ", cheapest " best; bad = 1 }
      choice[n] = $NF
      ringAt[n] = -1
      for (i = 2; i < NF; ++i) if (name[i] == "ring") ringAt[n] = $i + 0
    }
    END {
      if (n != rows) { print "FAIL: " what ": " n " rows, expected " rows; bad = 1 }
      exit bad
    }' || bad "$what"
  echo "$what: $(echo "$out" | tail -n +2 | awk '{printf "%s:%s ", $1, $NF}')"
}

# 4 hosts x 8 ranks: ring, tree, rhd, rd, hier, hierrd; 8 B .. 128 MiB by 4 (13 rows).
check "4x8 defaults" all 13 8 4 --hosts 4 --ranks-per-host 8
hdr=$(table --hosts 4 --ranks-per-host 8 | head -1 | tr -s ' ')
[[ $hdr == " bytes ring tree rhd rd hier hierrd choice" || $hdr == "bytes ring tree rhd rd hier hierrd choice" ]] ||
  bad "4x8 header is '$hdr'"
# Across hosts, a small message must not take the flat ring (2 (n-1) latencies).
small=$(table --hosts 4 --ranks-per-host 8 | awk 'NR == 2 {print $NF}')
[[ $small != ring ]] || bad "4x8: 8 B predicted fastest on the flat ring"
check "4x2 by 2" all 22 8 2 --hosts 4 --ranks-per-host 2 --max-bytes 16777216 --factor 2
# LOOM_ALGO narrows the choice exactly as in the library.
LOOM_ALGO=ring check "LOOM_ALGO=ring" "ring" 13 8 4 --hosts 4 --ranks-per-host 8
LOOM_ALGO='allreduce:^ring' check "LOOM_ALGO=allreduce:^ring" "tree rhd rd hier hierrd" 13 8 4 \
  --hosts 4 --ranks-per-host 8
LOOM_ALGO='allreduce:tree,hier' check "LOOM_ALGO=allreduce:tree,hier" "tree hier" 6 64 16 \
  --hosts 2 --ranks-per-host 4 --min-bytes 64 --max-bytes 67108864 --factor 16
# All-gather: ring and rhd only.
hdr=$(table --hosts 4 --ranks-per-host 2 --coll allgather | head -1 | tr -s ' ' | sed 's/^ //')
[[ $hdr == "bytes ring rhd choice" ]] || bad "allgather header is '$hdr'"
check "allgather 4x2" all 13 8 4 --hosts 4 --ranks-per-host 2 --coll allgather
# One host: the direct all-reduce is taken wherever it exists.
out=$(table --hosts 1 --ranks-per-host 4)
echo "$out" | head -1 | grep -q ' direct ' || bad "one host: no direct column"
[[ $(echo "$out" | tail -n +2 | awk '$NF != "direct"' | wc -l) == 0 ]] ||
  bad "one host: the choice is not direct everywhere"

# Bad arguments: exit 2, the message names the argument.
expect_usage() {
  local name=$1
  shift
  local msg
  msg=$("$TOPO" --file "$FILE" --no-paths "$@" 2>&1 >/dev/null)
  local rc=$?
  [[ $rc == 2 ]] || bad "$* exited $rc, expected 2"
  [[ $msg == *"$name"* ]] || bad "$*: message '$msg' does not name $name"
}
expect_usage --coll --coll gather
expect_usage --min-bytes --min-bytes 12x
expect_usage --factor --factor 1
expect_usage --max-bytes --min-bytes 64 --max-bytes 8
expect_usage --max-bytes --max-bytes 9223372036854775807
expect_usage --hosts --hosts 1e6
expect_usage --hosts --hosts 4097
expect_usage --max-channels --max-channels -5
expect_usage --ranks-per-host --ranks-per-host abc
expect_usage --ranks-per-core --ranks-per-core 2x
msg=$(LOOM_ALGO=quick "$TOPO" --file "$FILE" --no-paths 2>&1 >/dev/null)
[[ $? == 2 && $msg == *LOOM_ALGO* ]] || bad "LOOM_ALGO=quick: '$msg'"

((fail)) && { echo "loom-topo predictions: FAIL"; exit 1; }
echo "loom-topo predictions: PASS"
