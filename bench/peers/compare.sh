#!/usr/bin/env bash
# compare.sh: Loom's all-reduce beside Open MPI and Gloo on this host, in one run.
#
# usage: bench/peers/compare.sh [-q] [-o results.md] [-r reps] [-c shm2,shm4,shm8,tcp2,tcp4]
#                               [-b minbytes] [-e maxbytes] [-f factor] [-t budget_s] [-T timeout_s]
#                               [-W wait_s] [-N nice] [-l logdir] [BUILD_DIR (default ./build)]
#
# It builds nothing. Build first, in BUILD_DIR:
#   scripts/setup.sh                       # installs openmpi-bin, libopenmpi-dev, libgloo-dev
#   cmake -S . -B build && cmake --build build -j1 --target loom-perf memcpy-bw xcore-bw \
#       tcp-wire-perf mpi-allreduce-perf gloo-allreduce-perf
# A peer whose binary (or package) is missing shows as n/a; Loom's is required.
#
# Configurations (-c picks a subset):
#   shm2  2 ranks, shared memory: Loom as it chooses (shm); Open MPI ob1 with btl vader,self
#   shm4  4 ranks the same way, oversubscribing a 2-core machine
#   shm8  8 ranks the same way (not in the default set)
#   tcp2  2 ranks, TCP over loopback: Loom with LOOM_SHM_DISABLE=1; Open MPI ob1 with btl
#         tcp,self on lo
#   tcp4  4 ranks the same way (not in the default set)
# Gloo has only its TCP transport: it runs over loopback in every configuration.
# In the TCP configurations a fourth program runs in the same rotation: tcp-wire-perf, a bare
# exchange of the bytes a ring all-reduce moves over the same loopback sockets (no reduction), so
# that each size shows what a plain program gets out of this host's TCP beside what Loom and
# Gloo get.
# OMPI_SHM_MCA and OMPI_TCP_MCA (environment) replace the Open MPI flags above.
#
# Every run is float32/sum, out-of-place and in-place, checked (#wrong) by each benchmark. The
# sizes go from -b to -e (default 8 B to 256 MiB) by factor -f (default 4), plus -e itself and
# 64 MiB when in range. For each size, Loom, Open MPI and Gloo run one after the other (the first
# of them rotating from size to size), so that load from other work on the machine falls on all
# of them alike; -r repeats the whole sweep and keeps each one's best time. Iterations per size:
# 4 GiB / size, clamped to 5..20000 (warm-up 5; Gloo at most 1000), so that a small size's
# average spans tens of milliseconds and one descheduling does not decide it. A time budget
# (-t, default 2 s) bounds the timed iterations of each pass: a library's time per call is
# estimated from its last run in this configuration (this size in an earlier rep, else the
# previous size scaled by the size ratio), and the count is cut to budget / estimate, never
# below the minimum; where even the minimum overruns the budget, the warm-up is one call. It
# keeps the slow runs (a peer taking seconds per call at 256 MiB, Gloo taking milliseconds per
# small call with 8 ranks) from taking most of the run's time. -t 0 turns it off. -q (quick):
# 8 B to 64 MiB by factor 32 (8 B, 256 B, 8 KiB, 256 KiB, 8 MiB, 64 MiB), 512 MiB / size
# clamped to 3..2000 iterations, warm-up 2.
#
# Output: one merged table per configuration with each library's out-of-place time (us) and
# busbw (GB/s), the busbw ratios loom/ompi and loom/gloo (above 1: Loom is faster), up to
# 64 KiB where busbw rounds to 0 the time ratios (below 1: Loom is faster), and the busbw ratio
# loom/ompi in place (each one's best in-place time, from the same runs). One core's memcpy
# bandwidth (memcpy-bw, 64 MiB) is the yardstick for Loom's busbw at 64 MiB, measured two ways:
# at the start and at the end of the run, and beside the 64 MiB runs themselves (just before
# and just after each configuration's 64 MiB rotation, in every rep), as the peers are measured
# beside Loom; each keeps its best. The machine's speed drifts over a run (this project's
# development VMs have fast and slow phases of minutes), and the second is what the 64 MiB
# runs met. Copies of 512 KiB between two cores, within one, and between
# two cores through process_vm_readv (xcore-bw, at the start) show what bounds the middle sizes
# of shared memory, for Loom and for Open MPI's single copy. -o writes the same tables as
# markdown (for docs/PERFORMANCE.md). The TCP configurations get a second table: Loom beside the
# bare exchange (tcp-wire-perf), with the busbw ratios loom/wire and wire/gloo (how far above
# Gloo a program moving the bytes as the bare exchange does would be).
# Each run's own table is kept in the log directory (-l, default a new /tmp/loom-compare.*).
#
# Other work on the machine skews every number. Before each run the script samples the CPUs'
# idle share for 0.25 s; with -W it waits up to wait_s seconds for them to be at least 85% idle.
# The summary counts the runs that started on a busier machine, and records the load average.
# -N runs every benchmark (and the memcpy yardstick) under `nice -n NICE`; as root, a negative
# value (e.g. -N -10) lets them take the cores from other, normal-priority work.
#
# Exit status: 0 when every run of Loom passed its checks, 1 otherwise, 2 on bad usage.

set -uo pipefail

usage() {
  sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

bytes() {  # 64M -> 67108864
  local v=$1 m=1
  case $v in
    *[kK]) m=1024; v=${v%?} ;;
    *[mM]) m=$((1 << 20)); v=${v%?} ;;
    *[gG]) m=$((1 << 30)); v=${v%?} ;;
  esac
  [[ $v =~ ^[0-9]+$ ]] || { echo "compare.sh: $2 '$1': must be a size in bytes (K, M, G suffixes)" >&2; exit 2; }
  echo $((v * m))
}

human() {  # 67108864 -> "64 MiB"
  local b=$1
  if ((b >= 1 << 30 && b % (1 << 30) == 0)); then echo "$((b >> 30)) GiB"
  elif ((b >= 1 << 20 && b % (1 << 20) == 0)); then echo "$((b >> 20)) MiB"
  elif ((b >= 1 << 10 && b % (1 << 10) == 0)); then echo "$((b >> 10)) KiB"
  else echo "$b B"; fi
}

quick=0 out="" reps=1 configs="shm2,shm4,tcp2" minb="" maxb="" factor="" timeout_s=900 logdir=""
wait_s=0 nice_level="" budget_s=2
while getopts "qo:r:c:b:e:f:t:T:W:N:l:h" opt; do
  case $opt in
    q) quick=1 ;;
    o) out=$OPTARG ;;
    r) reps=$OPTARG ;;
    c) configs=$OPTARG ;;
    b) minb=$(bytes "$OPTARG" -b) || exit 2 ;;
    e) maxb=$(bytes "$OPTARG" -e) || exit 2 ;;
    f) factor=$OPTARG ;;
    t) budget_s=$OPTARG ;;
    T) timeout_s=$OPTARG ;;
    W) wait_s=$OPTARG ;;
    N) nice_level=$OPTARG ;;
    l) logdir=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
(($# <= 1)) || usage
build=${1:-./build}
bad_flag() {  # flag, value, what it must be
  echo "compare.sh: $1 '$2': must be $3" >&2
  exit 2
}
[[ $reps =~ ^[1-9][0-9]*$ ]] || bad_flag -r "$reps" "a whole number of sweeps, 1 or more"
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || bad_flag -T "$timeout_s" "a whole number of seconds, 1 or more"
[[ $wait_s =~ ^[0-9]+$ ]] || bad_flag -W "$wait_s" "a whole number of seconds"
[[ $budget_s =~ ^[0-9]+([.][0-9]+)?$ ]] || bad_flag -t "$budget_s" "a number of seconds (0: no budget)"
[[ -z $nice_level || $nice_level =~ ^-?[0-9]+$ ]] || bad_flag -N "$nice_level" "a nice level (-20 to 19)"
NICE=()
[[ -n $nice_level ]] && NICE=(nice -n "$nice_level")

ref_size=$((64 << 20))  # the size set against memcpy
gloo_nmax=1000
if ((quick)); then
  : "${minb:=8}" "${maxb:=$ref_size}" "${factor:=32}"
  iter_bytes=$((512 << 20)) nmin=3 nmax=2000 warm=2
else
  : "${minb:=8}" "${maxb:=$((256 << 20))}" "${factor:=4}"
  iter_bytes=$((4 << 30)) nmin=5 nmax=20000 warm=5
fi
if ! [[ $factor =~ ^[0-9]+$ ]] || ((factor < 2)); then
  echo "compare.sh: -f '$factor': must be a whole number, 2 or more" >&2
  exit 2
fi
((minb >= 1 && minb <= maxb)) || { echo "compare.sh: -b $minb and -e $maxb: need 1 <= -b <= -e" >&2; exit 2; }

sizes=()
for ((s = minb; s <= maxb; s *= factor)); do sizes+=("$s"); done
sizes+=("$maxb")
((minb <= ref_size && ref_size <= maxb)) && sizes+=("$ref_size")
mapfile -t sizes < <(printf '%s\n' "${sizes[@]}" | sort -n -u)

find_bin() {  # the first of BUILD/name, BUILD/bench/peers/name that is executable
  local p
  for p in "$build/$1" "$build/bench/peers/$1"; do
    [[ -x $p ]] && { echo "$p"; return; }
  done
}
LOOM=$(find_bin loom-perf)
MPI_PERF=$(find_bin mpi-allreduce-perf)
GLOO=$(find_bin gloo-allreduce-perf)
MEMCPY=$(find_bin memcpy-bw)
XCORE=$(find_bin xcore-bw)
WIRE=$(find_bin tcp-wire-perf)
KERNELS=$(find_bin loom-kernels-bench)
MPIRUN=$(command -v mpirun || true)
[[ -n $LOOM ]] || { echo "compare.sh: no loom-perf in $build (build it first)" >&2; exit 2; }
[[ -n $MPIRUN ]] || MPI_PERF=""
# loomR: Loom with loomMemAlloc buffers (-R 1), shm only; wire: the bare exchange, tcp only.
peers=(loom ompi gloo loomR wire)
declare -A BIN=([loom]=$LOOM [ompi]=$MPI_PERF [gloo]=$GLOO [loomR]=$LOOM [wire]=$WIRE)

: "${OMPI_SHM_MCA:=--mca pml ob1 --mca btl vader,self}"
: "${OMPI_TCP_MCA:=--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo}"
declare -A NP=([shm2]=2 [shm4]=4 [shm8]=8 [tcp2]=2 [tcp4]=4)
declare -A TITLE=(
  [shm2]="2 ranks, shared memory (Loom: shm; Open MPI: $OMPI_SHM_MCA; Gloo: TCP loopback)"
  [shm4]="4 ranks on $(nproc) cores, shared memory (Loom: shm; Open MPI: $OMPI_SHM_MCA; Gloo: TCP loopback)"
  [shm8]="8 ranks on $(nproc) cores, shared memory (Loom: shm; Open MPI: $OMPI_SHM_MCA; Gloo: TCP loopback)"
  [tcp2]="2 ranks, TCP loopback (Loom: LOOM_SHM_DISABLE=1; Open MPI: $OMPI_TCP_MCA; Gloo: TCP)"
  [tcp4]="4 ranks on $(nproc) cores, TCP loopback (Loom: LOOM_SHM_DISABLE=1; Open MPI: $OMPI_TCP_MCA; Gloo: TCP)")
IFS=, read -r -a cfgs <<<"$configs"
for c in "${cfgs[@]}"; do
  [[ -n ${NP[$c]:-} ]] || { echo "compare.sh: -c: unknown configuration '$c' (shm2, shm4, shm8, tcp2, tcp4)" >&2; exit 2; }
done

if [[ -z $logdir ]]; then
  logdir=$(mktemp -d /tmp/loom-compare.XXXXXX)
else
  mkdir -p "$logdir" || exit 2
fi
if [[ -n $out ]]; then
  : >"$out" || { echo "compare.sh: cannot write $out" >&2; exit 2; }
fi

# ---------------------------------------------------------------------------------------------
# Runs.

iters_for() {  # size -> iterations
  local n=$((iter_bytes / $1))
  ((n < nmin)) && n=$nmin
  ((n > nmax)) && n=$nmax
  echo "$n"
}

declare -A LAST  # [cfg,peer] = "size time_us" of that library's last run in this configuration

# budget_iters CFG PEER SIZE N: N cut to the time budget; prints "iterations warm-up".
budget_iters() {
  local cfg=$1 peer=$2 size=$3 n=$4 prev=${RES[$1,$2,$3]:-} last=${LAST[$1,$2]:-}
  local est=""
  if [[ -n $prev ]]; then
    est=${prev%% *}
  elif [[ -n $last ]]; then
    est=$(awk -v s="$size" -v l="$last" 'BEGIN { split(l, a, " "); print a[2] * s / a[1] }')
  fi
  if [[ -z $est || $budget_s == 0 ]]; then
    echo "$n $((warm < n ? warm : n))"
    return
  fi
  awk -v n="$n" -v est="$est" -v b="$budget_s" -v nmin="$nmin" -v warm="$warm" 'BEGIN {
    cap = int(b * 1e6 / (est > 0 ? est : 1e-3)); w = warm
    if (cap < n) n = cap
    if (n < nmin) { n = nmin; if (nmin * est > b * 1e6) w = 1 }
    if (w > n) w = n
    print n, w }'
}

idle_pct() {  # the CPUs' idle share over 0.25 s, in percent
  local -a a b
  read -r -a a </proc/stat
  sleep 0.25
  read -r -a b </proc/stat
  awk -v a="${a[*]:1:8}" -v b="${b[*]:1:8}" 'BEGIN { split(a, x); split(b, y)
    for (i = 1; i <= 8; ++i) t += y[i] - x[i]; idle = y[4] + y[5] - x[4] - x[5]
    printf "%d\n", (t > 0 ? 100 * idle / t : 100) }'
}

busy_runs=0 all_runs=0
wait_quiet() {  # samples (and with -W, waits for) an idle machine; notes the share in LOG
  local deadline=$((SECONDS + wait_s)) p
  while :; do
    p=$(idle_pct)
    ((p >= 85 || SECONDS >= deadline)) && break
  done
  all_runs=$((all_runs + 1))
  ((p >= 85)) || busy_runs=$((busy_runs + 1))
  echo "# CPUs idle before this run: $p%" >>"$1"
}

# run CFG PEER SIZE: runs one benchmark at one size; sets RESULT to "time_us busbw wrong
# inplace_time_us inplace_busbw" or "fail".
run() {
  local cfg=$1 peer=$2 size=$3 np=${NP[$1]} n w cmd log
  n=$(iters_for "$size")
  # Gloo takes 0.2-20 ms per small all-reduce: its count stays bounded.
  [[ $peer == gloo ]] && ((n > gloo_nmax)) && n=$gloo_nmax
  read -r n w < <(budget_iters "$cfg" "$peer" "$size" "$n")
  local args=(-b "$size" -e "$size" -n "$n" -w "$w" -d float -o sum)
  case $peer in
    loom | loomR)
      cmd=(env)
      [[ $cfg == tcp* ]] && cmd+=(LOOM_SHM_DISABLE=1)
      cmd+=("$LOOM" -np "$np" "${args[@]}")
      [[ $peer == loomR ]] && cmd+=(-R 1) ;;
    ompi)
      local mca=$OMPI_SHM_MCA
      [[ $cfg == tcp* ]] && mca=$OMPI_TCP_MCA
      # shellcheck disable=SC2206  # the MCA flags are words
      cmd=("$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" $mca "$MPI_PERF" "${args[@]}") ;;
    gloo)
      cmd=("$GLOO" -np "$np" -T "$timeout_s" "${args[@]}") ;;
    wire)
      cmd=("$WIRE" -np "$np" -T "$timeout_s" "${args[@]}") ;;
  esac
  log=$logdir/$cfg.$peer.$size.log
  wait_quiet "$log"
  echo "+ ${NICE[*]} ${cmd[*]}" >>"$log"
  timeout -k 10 "$timeout_s" "${NICE[@]}" "${cmd[@]}" >>"$log" 2>&1
  local rc=$?
  # A data row: size count type redop root time algbw busbw #wrong time algbw busbw #wrong.
  RESULT=$(awk -v rc=$rc '$1 ~ /^[0-9]+$/ && NF >= 13 { row = $6 " " $8 " " ($9 + $13) " " $10 " " $12 }
                 END { print (rc == 0 && row != "" ? row : "fail") }' "$log")
}

declare -A RES   # [cfg,peer,size] = "time_us busbw wrong" (best time over -r)
declare -A IRES  # [cfg,peer,size] = "time_us busbw" in place (best in-place time over -r)
declare -A WRONG  # [cfg,peer] = total #wrong, or "fail"
# faster TIME OLD: true where OLD (a kept "time ..." entry) is empty or TIME is below its time.
faster() { [[ -z $2 ]] || awk -v a="$1" -v b="${2%% *}" 'BEGIN { exit !(a < b) }'; }
memcpy_bw=()

measure_memcpy() {
  if [[ -n $MEMCPY ]]; then
    "${NICE[@]}" "$MEMCPY" $ref_size 20 | tee -a "$logdir/memcpy.log" | awk '{print $7}'
  elif [[ -n $KERNELS ]]; then
    "${NICE[@]}" "$KERNELS" --benchmark_filter=memcpy 2>/dev/null | tee -a "$logdir/memcpy.log" |
      awk '/bytes_per_second=/ { sub(/.*bytes_per_second=/, ""); v = $1 + 0;
             if ($1 ~ /G/) v *= 1.073741824; else if ($1 ~ /M/) v /= 953.67431640625;
             if (v > best) best = v } END { if (best > 0) printf "%.2f\n", best }'
  fi
}

declare -A MEMCPY_BESIDE  # [cfg] = best memcpy GB/s measured beside that configuration's 64 MiB runs
beside_memcpy() {
  local m
  m=$(measure_memcpy)
  [[ -n $m ]] || return 0
  awk -v a="$m" -v b="${MEMCPY_BESIDE[$1]:-0}" 'BEGIN { exit !(a > b) }' && MEMCPY_BESIDE[$1]=$m
  return 0
}

cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
# The Loom measured: the commit of the source tree BUILD_DIR was configured from.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
if rev=$(git -C "${src:-.}" rev-parse --short HEAD 2>/dev/null); then
  git -C "$src" diff --quiet HEAD 2>/dev/null || rev="$rev+local changes"
else
  rev="from ${src:-$build}"
fi
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
ompi_ver=$([[ -n $MPI_PERF ]] && "$MPIRUN" --version 2>/dev/null | head -n 1)
gloo_ver=$([[ -n $GLOO ]] && dpkg-query -W -f '${Version}' libgloo-dev 2>/dev/null)
echo "# Loom $rev vs ${ompi_ver:-Open MPI n/a} vs Gloo ${gloo_ver:-n/a}"
echo "# $(nproc) cores ($cpu), $(uname -sr), load average $load_start"
[[ -n $nice_level ]] && echo "# every run under nice -n $nice_level"
echo "# sizes: ${#sizes[@]} ($(human "${sizes[0]}") .. $(human "${sizes[-1]}")), reps $reps, logs in $logdir"

m=$(measure_memcpy)
[[ -n $m ]] && memcpy_bw+=("$m") && echo "# memcpy (1 core, $(human $ref_size)): $m GB/s"
# Copies between two cores beside copies within one and through process_vm_readv (xcore-bw,
# 512 KiB): what the direct all-reduce's middle sizes, and Open MPI's single copy, are made of.
# Empty with fewer than 2 CPUs or no xcore-bw.
xcore=""
if [[ -n $XCORE ]]; then
  xcore=$("${NICE[@]}" "$XCORE" 512K 2>/dev/null | tee -a "$logdir/xcore.log" |
    awk '{ printf "%s GB/s from another core'"'"'s cache, %s within one, %s rewriting lines another core read, %s through process_vm_readv (Open MPI'"'"'s single copy)", $7, $10, $13, ($16 == "n/a" ? "n/a" : $16 " GB/s") }')
  [[ -n $xcore ]] && echo "# copies of 512 KiB: $xcore"
fi

status=0
for ((rep = 1; rep <= reps; ++rep)); do
  for cfg in "${cfgs[@]}"; do
    echo "# running $cfg (rep $rep/$reps)" >&2
    i=0
    for size in "${sizes[@]}"; do
      ((size == ref_size)) && beside_memcpy "$cfg"
      for ((k = 0; k < ${#peers[@]}; ++k)); do
        peer=${peers[$(((i + k) % ${#peers[@]}))]}
        [[ -n ${BIN[$peer]} ]] || continue
        [[ $peer == loomR && $cfg != shm* ]] && continue
        [[ $peer == wire && $cfg != tcp* ]] && continue
        run "$cfg" "$peer" "$size"
        r=$RESULT
        if [[ $r == fail ]]; then
          WRONG[$cfg,$peer]=fail
          echo "compare.sh: $peer failed in $cfg at $size B; see $logdir/$cfg.$peer.$size.log" >&2
          continue
        fi
        read -r t b wr it ib <<<"$r"
        LAST[$cfg,$peer]="$size $t"
        [[ ${WRONG[$cfg,$peer]:-0} == fail ]] || WRONG[$cfg,$peer]=$((${WRONG[$cfg,$peer]:-0} + wr))
        faster "$t" "${RES[$cfg,$peer,$size]:-}" && RES[$cfg,$peer,$size]="$t $b $wr"
        [[ -n $it && $it != N/A ]] && faster "$it" "${IRES[$cfg,$peer,$size]:-}" && IRES[$cfg,$peer,$size]="$it $ib"
      done
      ((size == ref_size)) && beside_memcpy "$cfg"
      i=$((i + 1))
    done
  done
done

m=$(measure_memcpy)
[[ -n $m ]] && memcpy_bw+=("$m") && echo "# memcpy (1 core, $(human $ref_size)), at the end: $m GB/s"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
echo "# load average at the end: $load_end; runs started with the CPUs under 85% idle:" \
  "$busy_runs of $all_runs"
memcpy_best=$(printf '%s\n' "${memcpy_bw[@]}" 0 | sort -g | tail -n 1)

# ---------------------------------------------------------------------------------------------
# Merged tables.

md() { [[ -z $out ]] || echo "$*" >>"$out"; }

md "Loom $rev beside ${ompi_ver:-Open MPI (n/a)} and Gloo ${gloo_ver:-(n/a)}, all-reduce float32/sum,"
md "out-of-place, measured by \`bench/peers/compare.sh$( ((quick)) && echo " -q")\` on $(nproc) cores"
md "($cpu), $(date -u +%Y-%m-%d). busbw in GB/s, time in us; ratios above 1 (busbw) or below 1"
md "(time) favour Loom. One core's memcpy: ${memcpy_best} GB/s. Load average (1, 5, 15 min) at the"
md "start: $load_start; at the end: $load_end. Runs started with the CPUs under 85% idle: $busy_runs"
md "of $all_runs$( ((wait_s)) && echo " (after waiting up to ${wait_s} s for them)")$(
  [[ -n $nice_level ]] && echo "; every run under nice -n $nice_level")."
[[ -n $xcore ]] && md "Copies of 512 KiB (\`xcore-bw\`): $xcore."

# The side tables' awk: f(entry, i), a field of a "time busbw wrong" entry (n/a where the
# library did not run); ratio(num, den), busbw num / busbw den from the times (the same bytes),
# exact where busbw rounds to 0.
SIDE_AWK='
  function f(x, i) { if (x == "") return "n/a"; split(x, a, " "); return a[i] }
  function ratio(num, den) { if (num == "" || den == "") return "n/a"; split(num, a, " ")
    split(den, b, " "); if (a[1] + 0 == 0) return "n/a"; return sprintf("%.2f", b[1] / a[1]) }'

for cfg in "${cfgs[@]}"; do
  echo
  echo "## $cfg: ${TITLE[$cfg]}"
  printf '%10s | %9s %7s | %9s %7s | %9s %7s | %9s %9s | %9s %9s | %9s\n' size "loom us" GB/s \
    "ompi us" GB/s "gloo us" GB/s "bw l/ompi" "bw l/gloo" "t l/ompi" "t l/gloo" "in l/ompi"
  md ""
  md "#### $cfg: ${TITLE[$cfg]}"
  md ""
  md "| size | loom us | loom GB/s | ompi us | ompi GB/s | gloo us | gloo GB/s | busbw loom/ompi | busbw loom/gloo | time loom/ompi | time loom/gloo | in place: busbw loom/ompi |"
  md "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for size in "${sizes[@]}"; do
    line=$(awk -v size="$size" -v l="${RES[$cfg,loom,$size]:-}" -v o="${RES[$cfg,ompi,$size]:-}" \
      -v g="${RES[$cfg,gloo,$size]:-}" -v li="${IRES[$cfg,loom,$size]:-}" \
      -v oi="${IRES[$cfg,ompi,$size]:-}" '
      function t(x) { split(x, a, " "); return a[1] + 0 }
      function fmt_t(x) { if (x == "") return "n/a"; v = t(x)
        return sprintf(v >= 10000 ? "%.0f" : v >= 100 ? "%.1f" : "%.2f", v) }
      function fmt_b(x) { if (x == "") return "n/a"; split(x, a, " "); return a[2] }
      function ratio(num, den) { if (num == "" || den == "" || t(den) == 0) return "n/a"; r = t(num) / t(den)
        return sprintf(r >= 100 ? "%.0f" : r >= 10 ? "%.1f" : r >= 0.1 ? "%.2f" : "%.2g", r) }
      BEGIN {
        small = size <= 65536
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", fmt_t(l), fmt_b(l), fmt_t(o), fmt_b(o),
          fmt_t(g), fmt_b(g), ratio(o, l), ratio(g, l), small ? ratio(l, o) : "-", small ? ratio(l, g) : "-",
          ratio(oi, li)
      }')
    IFS=$'\t' read -r tl bl to bo tg bg rbo rbg rto rtg rbi <<<"$line"
    printf '%10s | %9s %7s | %9s %7s | %9s %7s | %9s %9s | %9s %9s | %9s\n' "$(human "$size")" \
      "$tl" "$bl" "$to" "$bo" "$tg" "$bg" "$rbo" "$rbg" "$rto" "$rtg" "$rbi"
    md "| $(human "$size") | $tl | $bl | $to | $bo | $tg | $bg | $rbo | $rbg | $rto | $rtg | $rbi |"
  done
  if [[ $cfg == shm* ]]; then
    # The same Loom with loomMemAlloc buffers, measured in the same rotation.
    echo "# $cfg with loomMemAlloc buffers (loom-perf -R 1): the input is read in place"
    printf '%10s | %9s %7s | %9s %7s | %9s %9s\n' size "loom us" GB/s "loomR us" GB/s "bw R/loom" "bw R/ompi"
    md ""
    md "$cfg with loomMemAlloc buffers (\`loom-perf -R 1\`, same run):"
    md ""
    md "| size | loom us | loom GB/s | loomR us | loomR GB/s | busbw loomR/loom | busbw loomR/ompi |"
    md "|---:|---:|---:|---:|---:|---:|---:|"
    for size in "${sizes[@]}"; do
      line=$(awk -v l="${RES[$cfg,loom,$size]:-}" -v r="${RES[$cfg,loomR,$size]:-}" \
        -v o="${RES[$cfg,ompi,$size]:-}" "$SIDE_AWK"'
        BEGIN { printf "%s\t%s\t%s\t%s\t%s\t%s\n", f(l, 1), f(l, 2), f(r, 1), f(r, 2), ratio(r, l), ratio(r, o) }')
      IFS=$'\t' read -r tl bl tr br rrl rro <<<"$line"
      printf '%10s | %9s %7s | %9s %7s | %9s %9s\n' "$(human "$size")" "$tl" "$bl" "$tr" "$br" "$rrl" "$rro"
      md "| $(human "$size") | $tl | $bl | $tr | $br | $rrl | $rro |"
    done
  fi
  if [[ $cfg == tcp* ]]; then
    # The bare exchange of the same bytes over the same sockets, measured in the same rotation.
    echo "# $cfg beside a bare exchange of the same bytes (tcp-wire-perf: no reduction)"
    printf '%10s | %9s %7s | %9s %7s | %7s | %9s %9s\n' size "loom us" GB/s "wire us" GB/s "gloo GB/s" \
      "bw l/wire" "bw w/gloo"
    md ""
    md "$cfg beside a bare exchange of the same bytes over the same sockets (\`tcp-wire-perf\`, same run):"
    md ""
    md "| size | loom us | loom GB/s | wire us | wire GB/s | gloo GB/s | busbw loom/wire | busbw wire/gloo |"
    md "|---:|---:|---:|---:|---:|---:|---:|---:|"
    for size in "${sizes[@]}"; do
      line=$(awk -v l="${RES[$cfg,loom,$size]:-}" -v w="${RES[$cfg,wire,$size]:-}" \
        -v g="${RES[$cfg,gloo,$size]:-}" "$SIDE_AWK"'
        BEGIN { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f(l, 1), f(l, 2), f(w, 1), f(w, 2), f(g, 2),
          ratio(l, w), ratio(w, g) }')
      IFS=$'\t' read -r tl bl tw bw bg rlw rwg <<<"$line"
      printf '%10s | %9s %7s | %9s %7s | %7s | %9s %9s\n' "$(human "$size")" "$tl" "$bl" "$tw" "$bw" "$bg" \
        "$rlw" "$rwg"
      md "| $(human "$size") | $tl | $bl | $tw | $bw | $bg | $rlw | $rwg |"
    done
  fi
  wrong="Wrong results (#wrong): loom ${WRONG[$cfg,loom]:-n/a}, ompi ${WRONG[$cfg,ompi]:-n/a}, gloo ${WRONG[$cfg,gloo]:-n/a}"
  [[ $cfg == shm* ]] && wrong+=", loom -R 1 ${WRONG[$cfg,loomR]:-n/a}"
  [[ $cfg == tcp* ]] && wrong+=", wire ${WRONG[$cfg,wire]:-n/a}"
  [[ ${WRONG[$cfg,loom]:-fail} == 0 ]] || status=1
  [[ $cfg != shm* || ${WRONG[$cfg,loomR]:-fail} == 0 ]] || status=1
  ref=${RES[$cfg,loom,$ref_size]:-}
  frac="no $(human $ref_size) row"
  if [[ -n $ref && $memcpy_best != 0 ]]; then
    frac=$(awk -v b="${ref#* }" -v m="$memcpy_best" -v s="${MEMCPY_BESIDE[$cfg]:-0}" 'BEGIN { split(b, a, " ")
      printf "Loom busbw at 64 MiB: %.2f GB/s = %.1f%% of one core'"'"'s memcpy at the start and end (%.2f GB/s)", a[1], 100 * a[1] / m, m
      if (s > 0) printf "; %.1f%% of its memcpy beside the 64 MiB runs (%.2f GB/s)", 100 * a[1] / s, s }')
  fi
  echo "# $wrong; $frac"
  md ""
  md "$wrong. $frac."
done
[[ -z $out ]] || echo "# markdown written to $out"
exit $status
