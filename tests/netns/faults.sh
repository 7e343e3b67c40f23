#!/usr/bin/env bash
# Faults between two "hosts": network namespaces A (ranks 0, 1) and B (ranks 2, 3), so ranks of
# one namespace talk over shared memory and ranks of different ones over TCP.
#   lossy: the hosts joined by a link that loses 5% of packets, reorders 25% and delays the rest
#          by 2 ms (tc netem where the kernel has it; else a userspace wire between two TUN
#          devices that does the same); the compact suite's all-reduces, several rounds, then
#          the whole compact suite must give exactly the right results.
#   cut:   the veth link set down in the middle of a run: every rank must fail within
#          LOOM_TIMEOUT_MS (plus slack), none may hang, and loomCommAbort must return at once.
#   kill:  rank 3 (namespace B) SIGKILLed in the middle of a run: ranks 0, 1 and 2 must fail
#          within the timeout and name rank 3, or name a survivor that failed first and whose
#          own error leads to rank 3 (a broken link does not carry its cause).
# Usage: faults.sh path/to/loom_fault_worker. Exit 0 when all pass, 77 (skip) without root or
# `ip netns`, 1 otherwise. FAULTS_ONLY="cut kill" runs a subset.
set -u

WORKER=${1:-}
TIMEOUT_MS=${LOOM_FAULTS_TIMEOUT_MS:-5000}
SLACK_MS=3000
ONLY=${FAULTS_ONLY:-"lossy cut kill"}

# Runs the command; when it fails, the whole test is skipped for the reason given first.
skip_unless() {
  local why=$1
  shift
  "$@" >/dev/null 2>&1 || { echo "SKIP: $why"; exit 77; }
}

if [[ -z "$WORKER" || ! -x "$WORKER" ]]; then
  echo "usage: $0 path/to/loom_fault_worker" >&2
  exit 2
fi
skip_unless "needs root to create network namespaces" test "$(id -u)" = 0
skip_unless "the ip command (iproute2) is not installed" command -v ip
skip_unless "ip netns is not available here" ip netns list

NS_A="lfA$$"
NS_B="lfB$$"
VA="lfvA$$"
VB="lfvB$$"
TA="lftA$$"
TB="lftB$$"
NET="10.$((200 + $$ % 50)).$(($$ % 250 + 1))"
NET2="10.$((200 + $$ % 50)).$(((($$ % 250) + 125) % 250 + 1))"
LOGS=$(mktemp -d /tmp/loom_faults.XXXXXX)
PORT=$((29600 + $$ % 300))
WORKERS=()
WIRE=""
FAILED=0

cleanup() {
  for pid in "${WORKERS[@]}" $WIRE; do kill -KILL "$pid" 2>/dev/null; done
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "$VA" 2>/dev/null
  [[ -n "${KEEP_LOGS:-}" ]] && echo "logs in $LOGS" || rm -rf "$LOGS"
}
trap cleanup EXIT

skip_unless "cannot create a network namespace" ip netns add "$NS_A"
ip netns add "$NS_B" || exit 1
skip_unless "cannot create a veth pair" ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$NS_A" && ip link set "$VB" netns "$NS_B" || exit 1
ip -n "$NS_A" addr add "$NET.1/24" dev "$VA" && ip -n "$NS_B" addr add "$NET.2/24" dev "$VB" || exit 1
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$NS_A" link set "$VA" up && ip -n "$NS_B" link set "$VB" up || exit 1

now_ms() { date +%s%3N; }

# Starts ranks 0..3 of `$WORKER args...` on interfaces $IF_A / $IF_B with the root at $ROOT.
start_ranks() {
  local phase=$1 timeout_ms=$2
  shift 2
  WORKERS=()
  PORT=$((PORT + 1))
  for rank in 0 1 2 3; do
    local ns=$NS_A ifname=$IF_A
    ((rank >= 2)) && ns=$NS_B ifname=$IF_B
    ip netns exec "$ns" env LOOM_RANK="$rank" LOOM_WORLD_SIZE=4 LOOM_COMM_ID="$ROOT:$PORT" \
      LOOM_SOCKET_IFNAME="$ifname" LOOM_TIMEOUT_MS="$timeout_ms" \
      "$WORKER" "$@" >"$LOGS/$phase.rank$rank.log" 2>&1 &
    WORKERS+=($!)
  done
}

# Waits until every rank printed READY (or $1 seconds passed).
wait_ready() {
  local phase=$1 deadline=$(($(date +%s) + $2))
  while (($(date +%s) < deadline)); do
    local ready=0
    for rank in 0 1 2 3; do grep -q "^READY" "$LOGS/$phase.rank$rank.log" 2>/dev/null && ((ready++)); done
    ((ready == 4)) && return 0
    sleep 0.1
  done
  echo "$phase: not every rank got through init"
  return 1
}

# Waits for the ranks (killing any still running after $2 s); sets RC[rank].
wait_ranks() {
  local phase=$1 deadline=$(($(date +%s) + $2))
  RC=()
  for rank in 0 1 2 3; do
    local pid=${WORKERS[$rank]}
    while kill -0 "$pid" 2>/dev/null && (($(date +%s) < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null
      echo "$phase: rank $rank still running after the deadline (hung): killed"
    fi
    wait "$pid" 2>/dev/null
    RC[$rank]=$?
  done
  WORKERS=()
}

fail() {
  echo "FAIL $*"
  FAILED=1
}

show_logs() {
  for rank in 0 1 2 3; do
    echo "---- $1 rank $rank ----"
    grep -v "cases, .* failed, .* API errors" "$LOGS/$1.rank$rank.log" | tail -n 15
  done
}

# ---- lossy: loss 5%, reorder 25%, delay 2 ms ----
wire_up() {
  IF_A=$VA IF_B=$VB ROOT=$NET.1 LINK="veth with tc netem"
  if ip netns exec "$NS_A" tc qdisc add dev "$VA" root netem loss 5% reorder 25% delay 2ms 2>/dev/null &&
    ip netns exec "$NS_B" tc qdisc add dev "$VB" root netem loss 5% reorder 25% delay 2ms 2>/dev/null; then
    return 0
  fi
  # No netem in this kernel: a userspace wire between two TUN devices, one per namespace.
  command -v python3 >/dev/null 2>&1 && [[ -c /dev/net/tun ]] || return 1
  ip -n "$NS_A" tuntap add dev "$TA" mode tun && ip -n "$NS_B" tuntap add dev "$TB" mode tun || return 1
  ip -n "$NS_A" addr add "$NET2.1/24" dev "$TA" && ip -n "$NS_B" addr add "$NET2.2/24" dev "$TB" || return 1
  ip -n "$NS_A" link set "$TA" mtu 9000 up && ip -n "$NS_B" link set "$TB" mtu 9000 up || return 1
  python3 - "$NS_A" "$TA" "$NS_B" "$TB" >"$LOGS/wire.log" 2>&1 <<'EOF' &
# Moves IP packets between two TUN devices like netem: each packet is lost with probability
# 5%; of the rest, 25% go at once and 75% after 2 ms, so the ones sent at once overtake.
import ctypes, fcntl, heapq, os, random, select, signal, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def open_tun(ns, name):
    fd = os.open("/var/run/netns/" + ns, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "setns " + ns)
    os.close(fd)
    t = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(t, 0x400454ca, struct.pack("16sH", name.encode(), 0x0001 | 0x1000))
    return t
a, b = open_tun(sys.argv[1], sys.argv[2]), open_tun(sys.argv[3], sys.argv[4])
peer = {a: b, b: a}
stats = {"packets": 0, "lost": 0, "at_once": 0}
def report(*_):
    print("wire: %(packets)d packets, %(lost)d lost, %(at_once)d sent at once" % stats, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
print("wire: up", flush=True)
queue, seq, rng = [], 0, random.Random(1)
while True:
    now = time.monotonic()
    while queue and queue[0][0] <= now:
        _, _, fd, data = heapq.heappop(queue)
        try:
            os.write(fd, data)
        except OSError:
            pass
    wait = max(0.0, queue[0][0] - now) if queue else 1.0
    for fd in select.select([a, b], [], [], wait)[0]:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            stats["packets"] += 1
            if rng.random() < 0.05:
                stats["lost"] += 1
                continue
            delay = 0.0 if rng.random() < 0.25 else 0.002
            stats["at_once"] += delay == 0.0
            seq += 1
            heapq.heappush(queue, (time.monotonic() + delay, seq, peer[fd], data))
EOF
  WIRE=$!
  for _ in $(seq 50); do grep -q "wire: up" "$LOGS/wire.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "wire: up" "$LOGS/wire.log" || { cat "$LOGS/wire.log"; return 1; }
  IF_A=$TA IF_B=$TB ROOT=$NET2.1 LINK="userspace TUN wire (no netem in this kernel)"
}

wire_down() {
  ip netns exec "$NS_A" tc qdisc del dev "$VA" root 2>/dev/null
  ip netns exec "$NS_B" tc qdisc del dev "$VB" root 2>/dev/null
  if [[ -n $WIRE ]]; then
    kill -TERM "$WIRE" 2>/dev/null
    wait "$WIRE" 2>/dev/null
    WIRE=""
    tail -n 1 "$LOGS/wire.log"
  fi
}

START=$(date +%s)
if [[ " $ONLY " == *" lossy "* ]]; then
  if ! wire_up; then
    echo "lossy: SKIPPED: no tc netem and no TUN device or python3 for a userspace wire"
  else
    t0=$(now_ms)
    start_ranks lossy 60000 correct "${LOSSY_ROUNDS:-6}"
    wait_ranks lossy 500
    wire_down
    for rank in 0 1 2 3; do
      line=$(grep -E "^(PASS|FAIL) rank" "$LOGS/lossy.rank$rank.log" | tail -1)
      echo "lossy ($LINK): rank $rank: ${line:-no result} (exit ${RC[$rank]})"
      ((RC[rank] == 0)) && [[ $line == PASS* ]] || fail "lossy: rank $rank"
    done
    echo "lossy: $(($(now_ms) - t0)) ms"
    ((FAILED)) && show_logs lossy
  fi
fi

IF_A=$VA IF_B=$VB ROOT=$NET.1

# The rank an ERROR line blames: its last "rank N" that is not "rank N of M" (the reporter).
blamed_by() {
  grep "^ERROR rank" "$LOGS/$1.rank$2.log" | tail -1 | sed 's/^[^:]*: //' |
    grep -oE "rank [0-9]+( of)?" | grep -v " of" | tail -1 | cut -d' ' -f2
}

# Checks that every rank of $1 failed within the timeout of $2 (ms, CLOCK_REALTIME); with $4,
# that following whom each one blames leads to rank $4.
check_errors() {
  local phase=$1 at=$2 ranks=$3 lost=${4:-}
  declare -A BLAME=()
  for rank in $ranks; do BLAME[$rank]=$(blamed_by "$phase" "$rank"); done
  for rank in $ranks; do
    if [[ -n $lost ]]; then
      local r=$rank chain=$rank hops=0
      while [[ -n $r && $r != "$lost" ]] && ((hops++ < 4)); do
        r=${BLAME[$r]:-}
        chain+=" -> ${r:-nobody}"
      done
      echo "$phase: rank $rank blames: $chain"
      [[ $r == "$lost" ]] || fail "$phase: rank $rank's error does not lead to rank $lost ($chain)"
    fi
    local line err
    line=$(grep "^ERROR rank" "$LOGS/$phase.rank$rank.log" | tail -1)
    err=$(sed -n 's/.* at_ms=\([0-9]*\).*/\1/p' <<<"$line")
    if [[ -z $err ]]; then
      fail "$phase: rank $rank reported no error (exit ${RC[$rank]})"
      continue
    fi
    local after=$((err - at))
    echo "$phase: rank $rank failed $after ms after the fault: ${line#*: }"
    ((after >= -50)) || fail "$phase: rank $rank failed before the fault"
    ((after <= TIMEOUT_MS + SLACK_MS)) || fail "$phase: rank $rank took $after ms (timeout $TIMEOUT_MS)"
    ((RC[rank] == 0)) || fail "$phase: rank $rank: $(grep -v '^ERROR' "$LOGS/$phase.rank$rank.log" | grep -E 'FAIL|does not name' | head -2)"
  done
}

# ---- cut: the veth link goes down mid-run ----
if [[ " $ONLY " == *" cut "* ]]; then
  start_ranks cut "$TIMEOUT_MS" until-error
  if wait_ready cut 60; then
    sleep 1
    at=$(now_ms)
    ip -n "$NS_A" link set "$VA" down
    wait_ranks cut $(((TIMEOUT_MS + SLACK_MS) / 1000 + 30))
    check_errors cut "$at" "0 1 2 3"
  else
    wait_ranks cut 1
    fail "cut: init"
  fi
  ((FAILED)) && show_logs cut
  ip -n "$NS_A" link set "$VA" up
  ip -n "$NS_B" link set "$VB" up
  sleep 1
fi

# ---- kill: rank 3, in the other namespace from ranks 0 and 1, dies mid-run ----
if [[ " $ONLY " == *" kill "* ]]; then
  start_ranks kill "$TIMEOUT_MS" until-error
  if wait_ready kill 60; then
    sleep 1
    victim=$(sed -n 's/^READY rank 3 pid \([0-9]*\).*/\1/p' "$LOGS/kill.rank3.log")
    at=$(now_ms)
    kill -KILL "$victim"
    wait_ranks kill $(((TIMEOUT_MS + SLACK_MS) / 1000 + 30))
    ((RC[3] == 137)) || fail "kill: rank 3 exit ${RC[3]}, expected death by SIGKILL (137)"
    check_errors kill "$at" "0 1 2" 3
  else
    wait_ranks kill 1
    fail "kill: init"
  fi
  ((FAILED)) && show_logs kill
fi

echo "faults: $( ((FAILED == 0)) && echo PASS || echo FAIL ) after $(($(date +%s) - START)) s"
exit $FAILED
