#!/usr/bin/env bash
# ab.sh: Loom against Loom: the all-reduce of two builds (say, the head before a change and
# after it), alternating in one run, so that load on the machine falls on both alike.
#
# usage: bench/ab.sh [-r reps] [-c shm2,shm4,shm8,tcp2] [-o table.md] OLD_BUILD NEW_BUILD
#
# Each build needs loom-perf (cmake --build DIR --target loom-perf). For each configuration the
# two builds' loom-perf runs alternate, reps times each (default 5), over small sizes (8 B to 64
# KiB, 2000 timed calls a size) and large ones (256 KiB to 64 MiB, 20 calls); every size keeps
# each build's best time, out of place and in place, checked by loom-perf (#wrong). The table
# gives both times and new/old: above 1.00 the new build is slower.
#   shmN  N ranks on this host (shared memory: the direct all-reduce)
#   tcpN  N ranks with LOOM_SHM_DISABLE=1 (TCP over loopback)
set -euo pipefail
reps=5
configs=shm2,shm4,shm8,tcp2
out=
while getopts "r:c:o:" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    c) configs=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n 2,13p "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { sed -n 2,13p "$0" >&2; exit 2; }
old=$1 new=$2
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: -r: '$reps' is not a count of 1 or more" >&2; exit 2; }
IFS=, read -ra cfgs <<<"$configs"
for cfg in "${cfgs[@]}"; do
  [[ $cfg =~ ^(shm|tcp)[1-9][0-9]*$ ]] ||
    { echo "ab.sh: -c: '$cfg' is not shmN or tcpN (N ranks)" >&2; exit 2; }
done
for b in "$old" "$new"; do
  [ -x "$b/loom-perf" ] || { echo "ab.sh: $b/loom-perf not built" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # old|new config rep part
  local label=$1 cfg=$2 rep=$3 part=$4 np=${2#???} env=() build=$old
  [ "$label" = new ] && build=$new
  [ "${cfg:0:3}" = tcp ] && env=(LOOM_SHM_DISABLE=1)
  local sizes=(-b 8 -e 64K -n 2000 -w 200)
  [ "$part" = large ] && sizes=(-b 256K -e 64M -n 20 -w 3)
  env "${env[@]}" "$build/loom-perf" -np "$np" "${sizes[@]}" -f 4 -T 300 \
    -J "$work/$cfg.$part.$label.$rep.json" >/dev/null
}

for cfg in "${cfgs[@]}"; do
  for ((r = 0; r < reps; r++)); do
    for part in small large; do
      # Which build goes first alternates from rep to rep.
      if ((r % 2 == 0)); then run old "$cfg" "$r" $part; run new "$cfg" "$r" $part
      else run new "$cfg" "$r" $part; run old "$cfg" "$r" $part; fi
    done
  done
done

python3 - "$work" "$configs" "${out:-/dev/null}" <<'EOF'
import glob, json, os, sys
work, configs, out = sys.argv[1:]
old, new = "old", "new"
lines = []
worst = 0.0
for cfg in configs.split(","):
    best = {}
    for f in glob.glob(os.path.join(work, cfg + ".*.json")):
        build = f.split(".")[-3]
        for row in json.load(open(f)):
            if row["oop_wrong"] or row["ip_wrong"]:
                sys.exit(f"ab.sh: wrong results in {f} at {row['size']} B")
            for mode in ("oop", "ip"):
                k = (build, row["size"], mode)
                best[k] = min(best.get(k, 1e30), row[mode + "_time_us"])
    lines.append(f"\n{cfg}: best of the runs, us (new/old above 1.00: new slower)\n")
    lines.append("| size | old oop | new oop | new/old | old ip | new ip | new/old |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted({k[1] for k in best}):
        cells = [str(size)]
        for mode in ("oop", "ip"):
            a, b = best[(old, size, mode)], best[(new, size, mode)]
            cells += [f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}"]
            worst = max(worst, b / a)
        lines.append("| " + " | ".join(cells) + " |")
lines.append(f"\nworst new/old: {worst:.2f}")
text = "\n".join(lines)
print(text)
open(out, "w").write(text + "\n")
EOF
