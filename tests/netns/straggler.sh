#!/usr/bin/env bash
# Straggler timing across real links. Three network namespaces ("hosts"), one rank each, joined
# through veth pairs to a bridge in a fourth namespace, so every rank talks to the others over
# TCP. The ranks (tests/tools/trace_paced_rank.cc) enter every all-reduce (ring, 3000 floats) at
# the same moment of the shared CLOCK_REALTIME, so callers are on time by construction; each
# dumps its flight recorder at destroy (LOOM_TRACE_DIR) and loom-trace merges the dumps.
#
#  1. Slow link: host 2's link is slowed by tc on its egress, so data FROM rank 2 arrives late
#     while rank 2 enters on time. With `netem delay 20ms` the expected delay is 20 ms; kernels
#     without sch_netem (this project's VMs) get `tbf rate 1mbit` instead, which delays the
#     first piece by its serialisation time: between (payload - burst) / rate and
#     wire bytes / rate (the bucket is full at each paced entry; wire bytes add the 40-byte frame
#     header and 66 bytes of Ethernet/IP/TCP headers per segment). The report must show it as
#     data, not entry: the slowest data is rank 2 -> rank 0 (its ring successor) and rank 2 heads
#     the per-sender table with that delay (+ 10 ms for scheduling on a loaded machine); the
#     other senders' first data comes within a quarter of it; rank 2's mean entry lateness stays
#     within the clock uncertainty (twice the largest clock error: a one-way delay biases the
#     clock sync by half the round trip) + 5 ms of pacing jitter.
#  2. Late caller: no tc; LOOM_INJECT_DELAY=1:30000:2 makes rank 1 enter every even operation
#     30 ms late. The straggler table's first row is rank 1, last at least 9 of those 10 times;
#     the median lateness of the delayed operations is 30 ms within the clock uncertainty,
#     -2 ms (the others' own wake-up may be late) and +10 ms (rank 1's sleep may overrun on a
#     loaded machine); rank 1's link is not blamed (its data delay, lateness taken off, stays
#     under a quarter of the delay).
# Clock alignment: every rank's measured offset to rank 0 lies within its error bound (the true
# offset is 0: the namespaces share one kernel clock).
#   straggler.sh TRACE_PACED_RANK LOOM_TRACE
# Exit 0 when every check passes, 77 (skip) without root, ip netns, veth, bridge or tc, 1
# otherwise.
set -u

RANK_BIN=${1:-}
TOOL=${2:-}
NRANKS=3
OPS=20
COUNT=3000  # floats: a ring chunk (the first piece rank 2 sends) is 4000 bytes
RANK_TIMEOUT_S=${LOOM_NETNS_TIMEOUT_S:-120}

skip() {
  echo "SKIP: $*"
  exit 77
}
[[ -n "$RANK_BIN" && -x "$RANK_BIN" && -n "$TOOL" && -x "$TOOL" ]] ||
  { echo "usage: $0 path/to/loom_trace_paced_rank path/to/loom-trace" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is not installed"
command -v tc >/dev/null 2>&1 || skip "the tc command (iproute2) is not installed"
ip netns list >/dev/null 2>&1 || skip "ip netns is not available here"

HUB="lsH$$"
NS=("ls0$$" "ls1$$" "ls2$$")
IF=("lsa0$$" "lsa1$$" "lsa2$$")  # host side; the bridge side is lsb<r>; at most 15 characters
SUBNET="10.232.$(($$ % 250 + 1))"
PORT=29617
LOGS=$(mktemp -d /tmp/loom_straggler.XXXXXX)
PIDS=()
failures=0

cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for ns in "${NS[@]}" "$HUB"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$LOGS"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

ip netns add "$HUB" 2>/dev/null || skip "cannot create a network namespace"
ip -n "$HUB" link add br0 type bridge 2>/dev/null || skip "cannot create a bridge"
ip -n "$HUB" link set br0 up && ip -n "$HUB" link set lo up || exit 1
for r in 0 1 2; do
  ip netns add "${NS[r]}" || exit 1
  ip link add "${IF[r]}" type veth peer name "lsb$r$$" 2>/dev/null || skip "cannot create a veth pair"
  ip link set "${IF[r]}" netns "${NS[r]}" && ip link set "lsb$r$$" netns "$HUB" || exit 1
  ip -n "$HUB" link set "lsb$r$$" master br0 && ip -n "$HUB" link set "lsb$r$$" up || exit 1
  ip -n "${NS[r]}" addr add "$SUBNET.$((r + 1))/24" dev "${IF[r]}" || exit 1
  ip -n "${NS[r]}" link set lo up && ip -n "${NS[r]}" link set "${IF[r]}" up || exit 1
done
if command -v ping >/dev/null 2>&1; then
  for r in 1 2; do
    for _ in $(seq 50); do
      ip netns exec "${NS[0]}" ping -c1 -W1 "$SUBNET.$((r + 1))" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
else
  sleep 2
fi

# The slow link: netem where the kernel has it, else a token bucket. Sets MODE, and LO_US and
# HI_US, the bounds of the first piece's expected delay.
slow_link() {
  local dev=${IF[2]}
  if ip netns exec "${NS[2]}" tc qdisc add dev "$dev" root netem delay 20ms 2>/dev/null; then
    MODE="netem delay 20ms"
    LO_US=20000
    HI_US=20000
  elif ip netns exec "${NS[2]}" tc qdisc add dev "$dev" root tbf rate 1mbit burst 1600 \
      latency 2s 2>/dev/null; then
    MODE="tbf rate 1mbit burst 1600 (no sch_netem in this kernel)"
    local payload=$((COUNT / NRANKS * 4 + 40)) segs=$(((COUNT / NRANKS * 4 + 40 + 1447) / 1448))
    LO_US=$(((payload - 1600) * 8))  # 1 Mbit/s: 8 us per byte
    HI_US=$(((payload + 66 * segs) * 8))
  else
    skip "tc can add neither netem nor tbf here"
  fi
  echo "slow link: host 2 (${IF[2]}): $MODE; expected first-data delay ${LO_US}..${HI_US} us"
}

# run_ranks NAME [VAR=VALUE...]: starts the three ranks, then loom-trace over their dumps into
# $LOGS/NAME.txt and $LOGS/NAME.perfetto.json. Period 400 ms: an operation over the slowed link
# takes about 150 ms, and must end before the next entry.
run_ranks() {
  local name=$1
  shift
  mkdir -p "$LOGS/$name"
  local start=$(($(date +%s%N) + 3000000000))
  PIDS=()
  for r in 0 1 2; do
    ip netns exec "${NS[r]}" env LOOM_RANK="$r" LOOM_WORLD_SIZE="$NRANKS" \
      LOOM_COMM_ID="$SUBNET.1:$PORT" LOOM_SOCKET_IFNAME="${IF[r]}" LOOM_TIMEOUT_MS=60000 \
      LOOM_ALGO=ring LOOM_TRACE_DIR="$LOGS/$name" "$@" \
      timeout -s KILL "$RANK_TIMEOUT_S" "$RANK_BIN" "$OPS" 400 "$COUNT" "$start" \
      >"$LOGS/$name.rank$r.log" 2>&1 &
    PIDS+=($!)
  done
  for r in 0 1 2; do
    wait "${PIDS[r]}"
    local rc=$?
    if ((rc != 0)) || ! grep -q "^PASS rank $r\b" "$LOGS/$name.rank$r.log"; then
      fail "$name: rank $r exited with $rc"
      cat "$LOGS/$name.rank$r.log"
    fi
    grep -h "overran" "$LOGS/$name.rank$r.log"
  done
  PIDS=()
  "$TOOL" "$LOGS/$name" --perfetto "$LOGS/$name.perfetto.json" >"$LOGS/$name.txt" 2>&1
  local rc=$?
  echo "--- loom-trace, $name (exit $rc)"
  cat "$LOGS/$name.txt"
  ((rc == 0)) || fail "$name: loom-trace exited with $rc, expected 0 (consistent)"
}

# Checks that each rank's clock offset in the dumps of run $1 lies within its error bound (the
# true offset is 0) and sets UNC, the clock uncertainty (twice the largest error), in us.
clock_check() {
  local max=0 dump off err
  for dump in "$LOGS/$1"/loom-trace-*-rank*.json; do
    off=$(grep -o '"clockOffsetNs":-\{0,1\}[0-9]*' "$dump" | cut -d: -f2)
    err=$(grep -o '"clockErrorNs":[0-9]*' "$dump" | cut -d: -f2)
    echo "$1: ${dump##*-}: clock offset to rank 0 ${off:-?} ns, error bound ${err:-?} ns"
    ((${off#-} <= err)) || fail "$1: offset $off ns is outside its error bound $err ns (true 0)"
    ((err > max)) && max=$err
  done
  UNC=$((2 * max / 1000))
  echo "$1: clock uncertainty $UNC us"
}

# Row of rank $2 in the straggler table of report $1: "ops last mean p99 max wait".
straggler_row() {
  awk -v r="$2" '/^  rank +ops/ { on = 1; next } on && $1 !~ /^[0-9]+$/ { on = 0 }
                 on && $1 == r { print $2, $3, $4, $5, $6, $7 }' "$1"
}
# Row of rank $2 in the per-sender table: "arrivals mean p99 max longest_waits waited_on".
sender_row() {
  awk -v r="$2" '/^  rank +arrivals/ { on = 1; next } on && $1 !~ /^[0-9]+$/ { on = 0 }
                 on && $1 == r { print $2, $3, $4, $5, $6, $7 }' "$1"
}
# le A B: A <= B for decimals.
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# 1. The slow link.
slow_link
run_ranks slowlink
clock_check slowlink
unc=$UNC
report="$LOGS/slowlink.txt"
line=$(grep -o "slowest data: rank [0-9]* -> rank [0-9]*, first data [0-9.]* us" "$report")
read -r from to mean < <(echo "$line" | sed -E 's/.*rank ([0-9]+) -> rank ([0-9]+), first data ([0-9.]+) us/\1 \2 \3/')
[[ "${from:-}" == 2 && "${to:-}" == 0 ]] ||
  fail "slowlink: slowest data named ${from:-?} -> ${to:-?}, expected 2 -> 0"
le "$LO_US" "${mean:-0}" && le "${mean:-0}" $((HI_US + 10000)) ||
  fail "slowlink: first data from rank 2 came ${mean:-?} us after entry, expected $LO_US..$((HI_US + 10000))"
read -r _ mean2 _ < <(sender_row "$report" 2)
top=$(awk '/^  rank +arrivals/ { getline; print $1; exit }' "$report")
[[ "$top" == 2 ]] || fail "slowlink: the per-sender table's first row is rank ${top:-none}, expected 2"
for r in 0 1; do
  read -r _ m _ < <(sender_row "$report" $r)
  le "${m:-1e9}" $((LO_US / 4)) ||
    fail "slowlink: rank $r's first data came ${m:-?} us after entry, expected under $((LO_US / 4))"
done
read -r _ _ late2 _ < <(straggler_row "$report" 2)
le "${late2:-1e9}" $((unc + 5000)) ||
  fail "slowlink: rank 2's mean entry lateness ${late2:-?} us; it entered on time (allowed $((unc + 5000)))"
echo "slowlink: data from rank 2 ${mean:-?} us late (expected $LO_US..$HI_US), entry lateness ${late2:-?} us"
ip netns exec "${NS[2]}" tc qdisc del dev "${IF[2]}" root || exit 1

# 2. The late caller.
DELAY_US=30000
run_ranks inject LOOM_INJECT_DELAY="1:$DELAY_US:2"
clock_check inject
unc=$UNC
report="$LOGS/inject.txt"
top=$(awk '/^  rank +ops/ { getline; print $1; exit }' "$report")
[[ "$top" == 1 ]] || fail "inject: the straggler table's first row is rank ${top:-none}, expected 1"
read -r ops last _ < <(straggler_row "$report" 1)
[[ "${ops:-0}" -eq $OPS ]] || fail "inject: ${ops:-0} operations timed, expected $OPS"
((${last:-0} >= OPS / 2 - 1)) || fail "inject: rank 1 last ${last:-0} times, expected at least $((OPS / 2 - 1))"
# The lateness of the delayed operations (even seq) from the trace's slices; the median.
median=$(grep -oE '"lateness_us":[0-9.e+-]+,"op":"[a-z]+","proto":"[A-Za-z]*","seq":[0-9]+' \
  "$LOGS/inject.perfetto.json" |
  sed -E 's/"lateness_us":([^,]*),.*"seq":([0-9]+)/\2 \1/' |
  awk '$1 % 2 == 0 && $2 > late[$1] { late[$1] = $2 } END { for (s in late) print late[s] }' |
  sort -g | awk '{ v[NR] = $1 } END { print NR ? (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) : -1 }')
lo=$((DELAY_US - unc - 2000)) hi=$((DELAY_US + unc + 10000))
le "$lo" "${median:--1}" && le "${median:--1}" "$hi" ||
  fail "inject: median lateness of the delayed operations ${median:-?} us, expected $lo..$hi"
read -r _ m1 _ < <(sender_row "$report" 1)
le "${m1:-1e9}" $((DELAY_US / 4)) ||
  fail "inject: rank 1's data delay ${m1:-?} us: its lateness was charged to its link"
echo "inject: median lateness of the delayed operations $median us (expected $lo..$hi)," \
  "rank 1's data delay ${m1:-?} us"

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
exit 0
