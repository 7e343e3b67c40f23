# shellcheck shell=bash
# Several "hosts" on one machine, for the multi-host benchmark (bench/multihost/run.sh) and
# test (tests/netns/multihost.sh). Sourced, not run.
#
# Each host is a network namespace with one veth link to a bridge that lives in a namespace
# of its own, so every host reaches every other one through its single link, as a machine
# reaches others through its NIC and a switch. tc shapes both ends of every link (rate with
# tbf; delay with netem, where the kernel has it), so each host's traffic in each direction
# goes through one shaped port.
#
#   mh_setup HOSTS RATE DELAY   build them (RATE e.g. 1gbit, '' unshaped; DELAY e.g. 1ms, '')
#   mh_run NRANKS LOGDIR CMD... start NRANKS ranks, rank r on host r * HOSTS / NRANKS (with
#                               MH_DEAL=1: on host r mod HOSTS, ranks dealt round-robin), wait,
#                               and return the number of ranks that failed; per-rank
#                               variables come from MH_ENV_r (a string of VAR=value words)
#   mh_cleanup                  kill what mh_run left and delete every namespace
# Afterwards MH_SHAPING says what was applied. Exits 77 (skip) where namespaces, veth pairs
# or bridges cannot be made here.

MH_TAG=$$
MH_NS=()
MH_PIDS=()
MH_SUBNET="10.233.$(($$ % 250 + 1))"
MH_PORT=29617
MH_SHAPING=""

mh_skip() {
  echo "SKIP: $*"
  mh_cleanup
  exit 77
}

mh_cleanup() {
  local pid ns
  for pid in "${MH_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  MH_PIDS=()
  for ns in "${MH_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  MH_NS=()
}

# Shapes the egress of one interface: tbf for the rate, netem below it for the delay.
mh_shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  if [[ -n $rate ]]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "${MH_BURST:-64kb}" latency 100ms ||
      return 1
    if [[ -n $delay && $MH_NETEM == 1 ]]; then
      tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" || return 1
    fi
  elif [[ -n $delay && $MH_NETEM == 1 ]]; then
    tc -n "$ns" qdisc add dev "$dev" root netem delay "$delay" || return 1
  fi
}

mh_setup() {
  local hosts=$1 rate=$2 delay=$3 h ns a b
  [[ "$(id -u)" == 0 ]] || mh_skip "needs root to create network namespaces"
  command -v ip >/dev/null 2>&1 || mh_skip "the ip command (iproute2) is not installed"
  [[ -z $rate && -z $delay ]] || command -v tc >/dev/null 2>&1 ||
    mh_skip "the tc command is not installed"
  MH_BR="lmbr$MH_TAG"
  ip netns add "$MH_BR" 2>/dev/null || mh_skip "cannot create a network namespace"
  MH_NS+=("$MH_BR")
  ip -n "$MH_BR" link add br0 type bridge 2>/dev/null || mh_skip "cannot create a bridge"
  ip -n "$MH_BR" link set br0 up || return 1
  # Does this kernel have netem? (Many minimal kernels leave CONFIG_NET_SCH_NETEM out.)
  MH_NETEM=0
  if [[ -n $delay ]]; then
    ip -n "$MH_BR" link add lmprobe type dummy 2>/dev/null
    tc -n "$MH_BR" qdisc add dev lmprobe root netem delay "$delay" 2>/dev/null && MH_NETEM=1
    ip -n "$MH_BR" link del lmprobe 2>/dev/null
  fi
  for ((h = 0; h < hosts; ++h)); do
    ns="lmh${h}x$MH_TAG"
    a="lh${h}x$MH_TAG"  # interface names stay within 15 characters
    b="lb${h}x$MH_TAG"
    ip netns add "$ns" || return 1
    MH_NS+=("$ns")
    ip link add "$a" type veth peer name "$b" 2>/dev/null || mh_skip "cannot create a veth pair"
    ip link set "$a" netns "$ns" && ip link set "$b" netns "$MH_BR" || return 1
    ip -n "$MH_BR" link set "$b" master br0 && ip -n "$MH_BR" link set "$b" up || return 1
    ip -n "$ns" addr add "$MH_SUBNET.$((h + 1))/24" dev "$a" || return 1
    ip -n "$ns" link set lo up && ip -n "$ns" link set "$a" up || return 1
    mh_shape "$ns" "$a" "$rate" "$delay" && mh_shape "$MH_BR" "$b" "$rate" "$delay" || {
      echo "tc could not shape $a/$b (rate '$rate', delay '$delay')"
      return 1
    }
  done
  MH_HOSTS=$hosts
  MH_SHAPING="$hosts hosts on a bridge, each link"
  [[ -n $rate ]] && MH_SHAPING+=" tbf rate $rate (burst ${MH_BURST:-64kb}) each way"
  if [[ -n $delay ]]; then
    if ((MH_NETEM)); then
      MH_SHAPING+=", netem delay $delay each way"
    else
      MH_SHAPING+=", no delay (this kernel has no netem qdisc: CONFIG_NET_SCH_NETEM is off)"
    fi
  fi
  [[ -z $rate && -z $delay ]] && MH_SHAPING+=" unshaped"
  # Let the links come up (the bridge forwards at once: no STP).
  sleep 0.5
  return 0
}

mh_run() {
  local nranks=$1 logs=$2 r h ns ifname failed=0 rc var
  shift 2
  MH_PIDS=()
  for ((r = 0; r < nranks; ++r)); do
    h=$((r * MH_HOSTS / nranks))
    [[ ${MH_DEAL:-0} == 1 ]] && h=$((r % MH_HOSTS))
    ns="lmh${h}x$MH_TAG"
    ifname="lh${h}x$MH_TAG"
    var="MH_ENV_$r"
    # shellcheck disable=SC2086  # MH_ENV_r is a list of words on purpose
    ip netns exec "$ns" env LOOM_RANK="$r" LOOM_WORLD_SIZE="$nranks" \
      LOOM_COMM_ID="$MH_SUBNET.1:$MH_PORT" LOOM_SOCKET_IFNAME="$ifname" ${!var:-} \
      timeout -s KILL "${MH_RANK_TIMEOUT_S:-300}" "$@" >"$logs/rank$r.log" 2>&1 &
    MH_PIDS+=($!)
  done
  for ((r = 0; r < nranks; ++r)); do
    wait "${MH_PIDS[$r]}"
    rc=$?
    if ((rc != 0)); then
      ((rc == 137)) && echo "rank $r: killed after ${MH_RANK_TIMEOUT_S:-300} s (hung)"
      echo "rank $r: exit $rc; last lines of its output:"
      tail -n 5 "$logs/rank$r.log" | sed 's/^/  /'
      failed=$((failed + 1))
    fi
  done
  MH_PIDS=()
  return $failed
}
