#!/usr/bin/env bash
# call_cost.sh: what one all-reduce of 2 ranks costs, layer by layer, in Loom and in Open MPI
# (shared memory: Loom's direct all-reduce; Open MPI's ob1 over vader), at a few sizes.
#
# usage: bench/call_cost.sh [-s 8,256,4096,65536] [-n calls] [-i instr_calls] [-r reps]
#                           [-o table.md] BUILD
#
# Instructions: rank 0 runs under valgrind's callgrind (rank 1 natively) and counts only the
# instr_calls (default 500) back-to-back calls of bench/call_cost.cc, not start-up or warm-up;
# each function's own instructions (callgrind_annotate, exclusive) go to the layer of its
# source file (Loom) or shared object (Open MPI), divided by the calls. A count does not change
# with the machine's load, so two builds or two libraries compare on a busy host. Waits show
# up small (rank 0, slowed by callgrind, is the last to arrive), so the count is the caller's
# own work.
# Time: both ranks natively, `calls` (default 20000) calls, the best of `reps` (default 5)
# alternating runs of Loom and Open MPI, in microseconds per call.
# BUILD holds loom-call-cost and bench/peers/mpi-call-cost (built where valgrind's headers and
# Open MPI are installed; scripts/setup.sh installs both). Prints a Markdown table (and writes
# it to table.md with -o); exits 1 when a run's result was wrong, 2 on bad usage, 77 when
# valgrind or a binary is missing.
set -u
sizes=8,256,4096,65536
calls=20000
icalls=500
reps=5
out=""
while getopts "s:n:i:r:o:" opt; do
  case $opt in
    s) sizes=$OPTARG ;;
    n) calls=$OPTARG ;;
    i) icalls=$OPTARG ;;
    r) reps=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n '4,5p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-}
[[ -n $build && -d $build ]] || { sed -n '4,5p' "$0" >&2; exit 2; }
[[ $sizes =~ ^[0-9]+(,[0-9]+)*$ ]] ||
  { echo "call_cost.sh: -s: '$sizes' is not a list of byte counts (8,256,4096)" >&2; exit 2; }
for v in "n:$calls" "i:$icalls" "r:$reps"; do
  [[ ${v#*:} =~ ^[1-9][0-9]*$ ]] ||
    { echo "call_cost.sh: -${v%%:*}: '${v#*:}' is not a count of 1 or more" >&2; exit 2; }
done
LOOM=$build/loom-call-cost
MPI=$build/bench/peers/mpi-call-cost
for tool in valgrind callgrind_annotate; do
  command -v $tool >/dev/null || { echo "SKIP: $tool is not installed (scripts/setup.sh)"; exit 77; }
done
[[ -x $LOOM ]] || { echo "SKIP: $LOOM is not built"; exit 77; }
HAVE_MPI=1
[[ -x $MPI ]] && command -v mpirun >/dev/null || HAVE_MPI=0
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl vader,self)
work=$(mktemp -d /tmp/loom-call-cost.XXXXXX)
trap 'rm -rf "$work"' EXIT
IFS=, read -r -a sz <<<"$sizes"
status=0
port=$((20000 + $$ % 20000))

# Runs Loom's two ranks: rank 0 with the prefix command in "$@" (a valgrind line, or none).
loom_pair() {  # bytes calls log -- [prefix...]
  local bytes=$1 n=$2 log=$3
  shift 4
  port=$((port + 1))
  local env=(LOOM_WORLD_SIZE=2 LOOM_COMM_ID=127.0.0.1:$port LOOM_TOPO_DISABLE=1
             LOOM_TIMEOUT_MS=600000)
  env "${env[@]}" LOOM_RANK=1 "$LOOM" "$bytes" "$n" >"$log.1" 2>&1 &
  local peer=$!
  env "${env[@]}" LOOM_RANK=0 "$@" "$LOOM" "$bytes" "$n" >"$log" 2>&1
  local rc=$?
  wait $peer || rc=1
  return $rc
}

mpi_pair() {  # bytes calls log -- [prefix...]
  local bytes=$1 n=$2 log=$3
  shift 4
  "${MPIRUN[@]}" -np 1 "$@" "$MPI" "$bytes" "$n" : -np 1 "$MPI" "$bytes" "$n" >"$log" 2>&1
}

# The per-call time of a log's "us_per_call" line, or "" when the run failed.
per_call() { sed -n 's/.*us_per_call \([0-9.]*\)$/\1/p' "$1" | head -n 1; }

# A callgrind output's exclusive instructions by layer: "layer<TAB>Ir" lines. Each function's
# own count goes by its source file (inlined code by the function's namespace) for Loom, by its
# shared object for Open MPI.
layers() {  # file kind(loom|mpi)
  callgrind_annotate --auto=no --inclusive=no --threshold=100 "$1" 2>/dev/null |
    awk -v kind="$2" -v root="$(cd "$(dirname "$0")/.." && pwd)/" '
    /^ *[0-9,]+ +\([ 0-9.]+%\) +[^ ]/ && !/PROGRAM TOTALS/ {
      ir = $1; gsub(",", "", ir)
      line = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", line)
      obj = ""
      if (match(line, / \[[^]]*\]$/)) { obj = substr(line, RSTART + 2, RLENGTH - 3); line = substr(line, 1, RSTART - 1) }
      i = index(line, ":"); file = substr(line, 1, i - 1); fn = substr(line, i + 1)
      if (index(file, root) == 1) file = substr(file, length(root) + 1)
      if (kind == "loom") {
        # By the source file where it is Loom'"'"'s own; code inlined from a header goes by the
        # namespace of the function it was inlined into (not by its arguments'"'"' types).
        own = fn
        gsub(/\(anonymous namespace\)/, "anon", own)
        ns = ""
        if (own ~ /^(anon::collective|loom[A-Z])/) ns = "api"
        else if (match(own, /loom::([a-z]+|Comm)::/)) ns = substr(own, RSTART + 6, RLENGTH - 8)
        l = ""
        if (file ~ /^src\/api\/api\.cc/) l = "C API: argument checks, error guard"
        else if (file ~ /^src\/api\//) l = "plan: group, tuner, cached schedule"
        else if (file ~ /^algorithms\/kernels\//) l = "reduction kernels"
        else if (file ~ /^algorithms\//) l = "schedule IR"
        else if (file ~ /^src\/trace\//) l = "flight recorder"
        else if (file ~ /^src\/exec\//) l = "executor steps and waits"
        else if (file ~ /^transport\//) l = "transports"
        else if (file ~ /^src\/comm\//) l = "communicator"
        else if (file ~ /^src\/util\//) l = "util: clock, status, log"
        else if (ns == "kernels") l = "reduction kernels"
        else if (ns == "algo") l = "schedule IR"
        else if (ns == "trace") l = "flight recorder"
        else if (ns == "exec") l = "executor steps and waits"
        else if (ns == "transport") l = "transports"
        else if (ns == "Comm") l = "communicator"
        else if (ns == "api" && own ~ /^loom::api::/) l = "plan: group, tuner, cached schedule"
        else if (ns == "api") l = "C API: argument checks, error guard"
        else if (ns != "" || own ~ /^loom::/) l = "util: clock, status, log"
        else if (obj ~ /ld-linux/) l = "dynamic linker: thread-locals, symbol look-ups"
        else if (obj ~ /libc\.so/ || file ~ /sysdeps|nptl|string\//) l = "libc: copies, locks, clock"
        else l = "other"
      } else {
        if (obj ~ /mca_coll_/) l = "collective components (coll)"
        else if (obj ~ /mca_(pml|btl|bml)_/) l = "point to point (pml ob1, btl vader)"
        else if (obj ~ /libmpi\.so/) l = "MPI API and requests (libmpi)"
        else if (obj ~ /libopen-pal|libopen-rte|libpmix|libevent|libhwloc/) l = "progress engine (libopen-pal)"
        else if (obj ~ /ld-linux/) l = "dynamic linker: thread-locals, symbol look-ups"
        else if (obj ~ /libc\.so/ || file ~ /sysdeps|nptl|string\//) l = "libc: copies, locks, clock"
        else l = "other"
      }
      sum[l] += ir
    }
    END { for (l in sum) printf "%s\t%d\n", l, sum[l] }'
}

declare -A LOOM_IR MPI_IR LOOM_US MPI_US
loom_rows=() mpi_rows=()
add_row() {  # array name, layer
  local -n rows=$1
  local r
  for r in "${rows[@]}"; do [[ $r == "$2" ]] && return; done
  rows+=("$2")
}
vg=(valgrind --tool=callgrind --instr-atstart=no)
sides=(loom)
((HAVE_MPI)) && sides+=(mpi)

# One side's (loom or mpi) instructions at size $2, by layer, into LOOM_IR or MPI_IR.
count_side() {
  local side=$1 s=$2
  local -n irs=${side^^}_IR
  if ! "${side}_pair" "$s" "$icalls" "$work/$side.$s.vg" -- "${vg[@]}" \
      --callgrind-out-file="$work/$side.$s.out"; then
    echo "$side-call-cost under callgrind failed at $s B:"; tail -n 5 "$work/$side.$s.vg"
    status=1
    return
  fi
  local l ir
  while IFS=$'\t' read -r l ir; do
    irs[$l,$s]=$ir
    add_row "${side}_rows" "$l"
  done < <(layers "$work/$side.$s.out" "$side")
}

# One native run of a side at size $2, its time per call kept in LOOM_US or MPI_US when the
# best so far.
time_side() {
  local side=$1 s=$2 t
  local -n uss=${side^^}_US
  if ! "${side}_pair" "$s" "$calls" "$work/$side.t" --; then
    echo "$side-call-cost failed at $s B:"; tail -n 3 "$work/$side.t"
    status=1
    return
  fi
  t=$(per_call "$work/$side.t")
  [[ -n $t ]] || return
  if [[ -z ${uss[$s]:-} ]] || awk -v a="$t" -v b="${uss[$s]}" 'BEGIN{exit !(a < b)}'; then
    uss[$s]=$t
  fi
}

for s in "${sz[@]}"; do
  for side in "${sides[@]}"; do count_side "$side" "$s"; done
  # Time, the sides alternating.
  for ((k = 0; k < reps; ++k)); do
    for side in "${sides[@]}"; do time_side "$side" "$s"; done
  done
done

# The table: instructions per call by layer, then the totals and the times.
table() {
  local cpu
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  echo "2 ranks on $(nproc) cores ($cpu): instructions per call of rank 0 by layer (callgrind, $icalls calls), and time per call (best of $reps runs of $calls calls)"
  echo
  local head="| layer |" rule="|---|" s
  for s in "${sz[@]}"; do head+=" $s B |"; rule+="---:|"; done
  echo "$head"
  echo "$rule"
  local side rows_name l line total
  for side in loom mpi; do
    [[ $side == mpi && $HAVE_MPI == 0 ]] && continue
    rows_name=${side}_rows
    local -n rows=$rows_name
    local -n irs=$([[ $side == loom ]] && echo LOOM_IR || echo MPI_IR)
    local -n uss=$([[ $side == loom ]] && echo LOOM_US || echo MPI_US)
    local name=$([[ $side == loom ]] && echo Loom || echo "Open MPI")
    local sorted=()
    mapfile -t sorted < <(for l in "${rows[@]}"; do printf '%s\t%s\n' "${irs[$l,${sz[0]}]:-0}" "$l"; done |
                          sort -t$'\t' -k1,1nr | cut -f2)
    for l in "${sorted[@]}"; do
      line="| $name: $l |"
      for s in "${sz[@]}"; do line+=" $(awk -v v="${irs[$l,$s]:-0}" -v n="$icalls" 'BEGIN{printf "%.0f", v / n}') |"; done
      echo "$line"
    done
    line="| **$name: instructions per call** |"
    for s in "${sz[@]}"; do
      total=0
      for l in "${rows[@]}"; do total=$((total + ${irs[$l,$s]:-0})); done
      line+=" **$(awk -v v="$total" -v n="$icalls" 'BEGIN{printf "%.0f", v / n}')** |"
    done
    echo "$line"
    line="| **$name: us per call** |"
    for s in "${sz[@]}"; do line+=" **${uss[$s]:-failed}** |"; done
    echo "$line"
  done
}
table | tee ${out:+"$out"}
exit $status
