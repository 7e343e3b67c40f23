#!/usr/bin/env bash
# Multi-host test on one machine: two network namespaces ("hosts") joined by a
# veth pair. Ranks 0 and 1 run in namespace A, ranks 2 and 3 in B, so ranks of
# one namespace talk over shared memory and ranks of different ones over TCP.
# Usage: run.sh path/to/loom_mp_worker. Exit 0 when all four ranks pass, 77
# (skip) without root or `ip netns`, 1 otherwise.
set -u

WORKER=${1:-}
NRANKS=4
RANK_TIMEOUT_S=${LOOM_NETNS_TIMEOUT_S:-300}

skip() {
  echo "SKIP: $*"
  exit 77
}

[[ -n "$WORKER" && -x "$WORKER" ]] || { echo "usage: $0 path/to/loom_mp_worker" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is not installed"
ip netns list >/dev/null 2>&1 || skip "ip netns is not available here"

NS_A="loomA$$"
NS_B="loomB$$"
VETH_A="lmA$$"  # interface names must stay within 15 characters
VETH_B="lmB$$"
SUBNET="10.231.$(($$ % 250 + 1))"
ADDR_A="$SUBNET.1"
ADDR_B="$SUBNET.2"
PORT=29517
LOGS=$(mktemp -d /tmp/loom_netns.XXXXXX)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "$VETH_A" 2>/dev/null
  rm -rf "$LOGS"
}
trap cleanup EXIT

ip netns add "$NS_A" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$NS_B" || exit 1
ip link add "$VETH_A" type veth peer name "$VETH_B" 2>/dev/null || skip "cannot create a veth pair"
ip link set "$VETH_A" netns "$NS_A" && ip link set "$VETH_B" netns "$NS_B" || exit 1
ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A" || exit 1
ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B" || exit 1
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$NS_A" link set "$VETH_A" up && ip -n "$NS_B" link set "$VETH_B" up || exit 1

# Wait until the link carries traffic.
if command -v ping >/dev/null 2>&1; then
  for _ in $(seq 50); do
    ip netns exec "$NS_A" ping -c1 -W1 "$ADDR_B" >/dev/null 2>&1 && break
    sleep 0.1
  done
else
  sleep 1
fi

echo "netns: $NS_A ($VETH_A $ADDR_A): ranks 0,1; $NS_B ($VETH_B $ADDR_B): ranks 2,3;" \
  "LOOM_COMM_ID=$ADDR_A:$PORT"
START=$(date +%s)
for rank in $(seq 0 $((NRANKS - 1))); do
  if ((rank < 2)); then ns=$NS_A ifname=$VETH_A; else ns=$NS_B ifname=$VETH_B; fi
  ip netns exec "$ns" env LOOM_RANK="$rank" LOOM_WORLD_SIZE="$NRANKS" \
    LOOM_COMM_ID="$ADDR_A:$PORT" LOOM_SOCKET_IFNAME="$ifname" LOOM_TIMEOUT_MS=60000 \
    LOOM_TRACE_DIR="$LOGS" \
    timeout -s KILL "$RANK_TIMEOUT_S" "$WORKER" >"$LOGS/rank$rank.log" 2>&1 &
  PIDS+=($!)
done

status=0
for rank in $(seq 0 $((NRANKS - 1))); do
  wait "${PIDS[$rank]}"
  rc=$?
  ((rc == 137)) && echo "rank $rank: killed after ${RANK_TIMEOUT_S} s (hung)"
  if ((rc != 0)) || ! grep -q "^PASS rank $rank\b" "$LOGS/rank$rank.log"; then
    echo "rank $rank: FAILED (exit $rc)"
    status=1
  fi
done
PIDS=()

# Clock alignment: every rank dumped its recorder at destroy. The namespaces share one kernel
# clock, so the true offset between the hosts is 0: each measured offset must lie within its own
# error bound, the bound must be set (and small) across the veth link, and 0 on rank 0's host.
for rank in $(seq 0 $((NRANKS - 1))); do
  dump=$(ls "$LOGS"/loom-trace-*-rank"$rank".json 2>/dev/null | head -1)
  if [[ -z $dump ]]; then
    echo "rank $rank: no trace dump in LOOM_TRACE_DIR"
    status=1
    continue
  fi
  off=$(grep -o '"clockOffsetNs":-\{0,1\}[0-9]*' "$dump" | cut -d: -f2)
  err=$(grep -o '"clockErrorNs":[0-9]*' "$dump" | cut -d: -f2)
  echo "rank $rank: clock offset to rank 0 ${off} ns, error bound ${err} ns"
  if ((rank < 2)); then
    ((off == 0 && err == 0)) || { echo "rank $rank: rank 0's host must have offset 0"; status=1; }
  elif ((err <= 0 || err > 5000000 || (off < 0 ? -off : off) > err)); then
    echo "rank $rank: offset ${off} ns is not within its error bound ${err} ns (true offset 0)"
    status=1
  fi
done

for rank in $(seq 0 $((NRANKS - 1))); do
  echo "---- rank $rank ----"
  tail -n 40 "$LOGS/rank$rank.log"
done
echo "netns: $( ((status == 0)) && echo PASS || echo FAIL ) after $(($(date +%s) - START)) s"
exit $status
