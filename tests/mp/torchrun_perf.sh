#!/usr/bin/env bash
# loom-perf started as torchrun starts its workers: 4 processes, each with RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT, and no LOOM_* variable
# at all, so loomCommInitFromEnv must take the torchrun path (root at MASTER_PORT + 1).
# Checks every exit status, that one table covers 4 ranks and every size from 8 B to 1 MiB, and
# the result line. Exit status: 0 pass, 1 fail.
# usage: torchrun_perf.sh LOOM_PERF
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 LOOM_PERF" >&2; exit 2; }
perf=$1
[ -x "$perf" ] || { echo "FAIL: $perf is not an executable"; exit 1; }
world=4
# shellcheck source=perf_table_checks.sh
source "$(dirname "$0")/perf_table_checks.sh"

port_free() { ! (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

# A loopback port nothing listens on, with the next one free too (Loom's root takes it).
free_port_pair() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    if port_free "$p" && port_free $((p + 1)); then
      echo "$p"
      return 0
    fi
  done
  return 1
}

port=$(free_port_pair) || { echo "FAIL: no free pair of loopback ports"; exit 1; }
work=$(mktemp -d /tmp/loom_torchrun_XXXXXX)
trap 'rm -rf "$work"' EXIT

# Only torchrun's variables may name the ranks: drop Loom's own and every other launcher's.
unset_args=()
for v in $(compgen -e); do
  case $v in
    LOOM_* | OMPI_* | PMIX_* | SLURM_* | RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | \
    MASTER_ADDR | MASTER_PORT) unset_args+=(-u "$v") ;;
  esac
done

pids=()
for ((r = 0; r < world; r++)); do
  env "${unset_args[@]}" RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world \
    GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 240 "$perf" -b 8 -e 1M -c 1 >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
# shellcheck source=../check_lib.sh
source "$(dirname "$0")/../check_lib.sh"
for ((r = 0; r < world; r++)); do
  wait "${pids[$r]}"
  rc=$?
  echo "---- rank $r (exit status $rc)"
  cat "$work/rank$r.log"
  [ $rc -eq 0 ] || fail "rank $r exited with status $rc"
done
out=$(cat "$work"/rank*.log)
check_perf_table "$out" $world
if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: loom-perf as 4 torchrun-style workers (MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)"
