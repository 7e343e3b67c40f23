#!/usr/bin/env bash
# loom-perf started by Open MPI's mpirun as 4 ranks: each finds its communicator with
# loomCommInitFromEnv (OMPI_COMM_WORLD_RANK and _SIZE, LOOM_COMM_ID on a free loopback port).
# Checks the exit status, that one table covers 4 ranks and every size from 8 B to 1 MiB, and
# the result line. Exit status: 0 pass, 1 fail, 77 (skip) without mpirun.
# usage: mpirun_perf.sh LOOM_PERF
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 LOOM_PERF" >&2; exit 2; }
perf=$1
# shellcheck source=perf_table_checks.sh
source "$(dirname "$0")/perf_table_checks.sh"
if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun not found (Debian package openmpi-bin; scripts/setup.sh installs it)"
  exit 77
fi

# A loopback port nothing listens on.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    if ! (: </dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

port=$(free_port) || { echo "FAIL: no free loopback port"; exit 1; }
# Only Open MPI's variables may name the ranks, so none of the launchers checked before it.
unset LOOM_RANK LOOM_WORLD_SIZE RANK WORLD_SIZE
export LOOM_COMM_ID=127.0.0.1:$port LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT_MS=60000
out=$(timeout 240 mpirun --allow-run-as-root --oversubscribe -np 4 \
  -x LOOM_COMM_ID -x LOOM_SOCKET_IFNAME -x LOOM_TIMEOUT_MS \
  "$perf" -b 8 -e 1M -c 1 2>&1)
rc=$?
echo "$out"
# shellcheck source=../check_lib.sh
source "$(dirname "$0")/../check_lib.sh"
[ $rc -eq 0 ] || fail "mpirun exited with status $rc"
check_perf_table "$out" 4
if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: loom-perf under mpirun -np 4"
