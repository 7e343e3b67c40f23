#!/usr/bin/env bash
# Multi-host all-reduce benchmark on one machine: 4 hosts x 2 ranks in network namespaces
# joined by a bridge, the inter-host links shaped with tc (hosts.sh). loom-perf runs the
# same sweep once with the tuner's choice, then with each algorithm forced by LOOM_ALGO,
# and one table per size shows every run's time and bus bandwidth, the algorithm the
# tuner chose (from its own predictions, logged at LOOM_DEBUG=INFO) and tuner / fastest.
#
# Usage: bench/multihost/run.sh [path/to/loom-perf]     (default: build/loom-perf)
# Settings (environment):
#   MH_HOSTS=4 MH_RANKS_PER_HOST=2   the layout
#   MH_RATE=1gbit MH_DELAY=1ms       shaping of each link, each way ('' for none)
#   MH_BURST=64kb                    tbf bucket: bytes that may pass at line rate after a pause
#   MH_MIN=8 MH_MAX=16M MH_FACTOR=2  the sizes
#   MH_ITERS=20 MH_WARMUP=5          timed and untimed iterations per size
#   MH_ROUNDS=2                      every run repeated, rounds alternating the runs; each
#                                    size keeps its fastest round (this machine's speed
#                                    changes by up to 2x between minutes)
#   MH_ALGOS="ring tree rhd rd hier hierrd"  the forced runs beside the tuner's
#   MH_SMALL=65536                   "small" for the tree/hier versus ring verdict
#   MH_OUT=dir                       keep the logs and JSON there (default: a temporary dir)
#   MH_TABLE=file                    the tuner's run prices with this LOOM_TUNER_TABLE
#   MH_CALIBRATE=1                   the tuner's run measures its table at start-up
#                                    (LOOM_TUNER_CALIBRATE=1)
# Exit: 0 when every run completed (the verdicts are printed, not enforced), 1 when a run
# failed, 2 on bad usage, 77 where namespaces cannot be made.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PERF=${1:-$HERE/../../build/loom-perf}
[[ -x $PERF ]] || { echo "usage: $0 path/to/loom-perf ($PERF is not executable)" >&2; exit 2; }
PERF=$(cd "$(dirname "$PERF")" && pwd)/$(basename "$PERF")
HOSTS=${MH_HOSTS:-4}
PER_HOST=${MH_RANKS_PER_HOST:-2}
NRANKS=$((HOSTS * PER_HOST))
ALGOS=${MH_ALGOS:-ring tree rhd rd hier hierrd}
ROUNDS=${MH_ROUNDS:-2}
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is needed for the table"; exit 77; }

# shellcheck source=hosts.sh
source "$HERE/hosts.sh"
OUT=${MH_OUT:-$(mktemp -d /tmp/loom_multihost.XXXXXX)}
mkdir -p "$OUT"
trap 'mh_cleanup; [[ -z ${MH_OUT:-} ]] && rm -rf "$OUT"' EXIT
mh_setup "$HOSTS" "${MH_RATE-1gbit}" "${MH_DELAY-1ms}" || { echo "namespace set-up failed"; exit 1; }
echo "# $HOSTS hosts x $PER_HOST ranks: $MH_SHAPING"
echo "# loom-perf all_reduce float sum, sizes ${MH_MIN:-8}..${MH_MAX:-16M} x${MH_FACTOR:-2}," \
  "${MH_ITERS:-20} iterations (+${MH_WARMUP:-5} warm-up); time = the fastest of out-of-place, in-place and $ROUNDS rounds"

status=0
for ((round = 1; round <= ROUNDS; ++round)); do
  for cfg in tuner $ALGOS; do
    mkdir -p "$OUT/$cfg"
    for ((r = 0; r < NRANKS; ++r)); do
      v="LOOM_TIMEOUT_MS=120000"
      [[ $cfg != tuner ]] && v+=" LOOM_ALGO=allreduce:$cfg"
      [[ $cfg == tuner && -n ${MH_TABLE:-} ]] && v+=" LOOM_TUNER_TABLE=$MH_TABLE"
      [[ $cfg == tuner && ${MH_CALIBRATE:-0} == 1 ]] && v+=" LOOM_TUNER_CALIBRATE=1"
      # Rank 0 of the tuner's first run logs the tuner's predictions, from which its choice
      # is read.
      [[ $cfg == tuner && $r == 0 && $round == 1 ]] &&
        v+=" LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNE LOOM_DEBUG_FILE=$OUT/$cfg/tune.log"
      printf -v "MH_ENV_$r" '%s' "$v"
    done
    start=$(date +%s.%N)
    mh_run "$NRANKS" "$OUT/$cfg" "$PERF" -C all_reduce -b "${MH_MIN:-8}" -e "${MH_MAX:-16M}" \
      -f "${MH_FACTOR:-2}" -n "${MH_ITERS:-20}" -w "${MH_WARMUP:-5}" -c 0 -J "$OUT/$cfg/perf.$round.json"
    failed=$?
    printf '# %-6s round %d: %s, %s s\n' "$cfg" "$round" \
      "$( ((failed)) && echo "FAILED ($failed ranks)" || echo "done")" \
      "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')"
    ((failed)) && status=1
  done
done
((status)) && exit 1

python3 - "$OUT" "${MH_SMALL:-65536}" "$ROUNDS" tuner $ALGOS <<'PY'
import json, re, sys
out, small, rounds, cfgs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
runs = {}
for cfg in cfgs:
    runs[cfg] = {}
    for rnd in range(1, rounds + 1):
        for row in json.load(open(f"{out}/{cfg}/perf.{rnd}.json")):
            t = [row[k] for k in ("oop_time_us", "ip_time_us") if row.get(k) is not None]
            bw = [row[k] for k in ("oop_busbw", "ip_busbw") if row.get(k) is not None]
            best = runs[cfg].get(row["size"])
            if best is None or min(t) < best[0]:
                runs[cfg][row["size"]] = (min(t), max(bw))
# The tuner's choice per size: its cheapest prediction, as src/api/group.cc picks it (the
# first candidate wins a tie). Predictions are logged once per power-of-two bucket.
pred = {}
for line in open(f"{out}/tuner/tune.log", errors="replace"):
    m = re.search(r"allreduce of (\d+) bytes: (\w+) predicted ([\d.inf]+) us", line)
    if m:
        pred.setdefault(int(m.group(1)), []).append((m.group(2), float(m.group(3))))
def choice(size):
    if size not in pred:
        return "?"
    best = pred[size][0]
    for a in pred[size][1:]:
        if a[1] < best[1]:
            best = a
    return best[0]
forced = cfgs[1:]
hdr = f"{'bytes':>10}  {'tuner':>6} {'us':>10} {'GB/s':>6}"
for c in forced:
    hdr += f"  {c + ' us':>10} {'GB/s':>6}"
print(hdr + f"  {'fastest':>7}  tuner/best  choice/best")
worst, worst_size, ok = 0.0, 0, True
cworst, cworst_size, cok = 0.0, 0, True
small_rows, small_wins = 0, 0
for size in sorted(runs["tuner"]):
    tt, tb = runs["tuner"][size]
    line = f"{size:>10}  {choice(size):>6} {tt:>10.1f} {tb:>6.3f}"
    times = {"tuner": tt}
    for c in forced:
        ft, fb = runs[c].get(size, (float("nan"), float("nan")))
        times[c] = ft
        line += f"  {ft:>10.1f} {fb:>6.3f}"
    best_cfg = min(forced, key=lambda c: times[c])
    best = min(times.values())
    ratio = tt / best
    # The chosen algorithm's own forced run against the fastest forced run: whether the
    # choice was right, apart from the noise between the tuner's run and the forced ones.
    picked = choice(size)
    cratio = times[picked] / min(times[c] for c in forced) if picked in times else float("nan")
    flag = "" if ratio <= 1.10 else "  > 10%"
    ctext = f"{cratio:>11.2f}" if cratio == cratio else f"{'not run':>11}"
    print(line + f"  {best_cfg:>7}  {ratio:>10.2f}  {ctext}{flag}")
    if cratio == cratio:
        if cratio > cworst:
            cworst, cworst_size = cratio, size
        cok &= cratio <= 1.10
    if ratio > worst:
        worst, worst_size = ratio, size
    ok &= ratio <= 1.10
    if size <= small and "ring" in times:
        small_rows += 1
        small_wins += min(times.get(c, 1e30) for c in ("tree", "hier", "hierrd")) < times["ring"]
print(f"# tuner within 10% of the fastest at every size: {'yes' if ok else 'NO'}"
      f" (worst tuner/best {worst:.2f} at {worst_size} B)")
print(f"# the tuner's choice, run forced, within 10% of the fastest forced run at every size: "
      f"{'yes' if cok else 'NO'} (worst {cworst:.2f} at {cworst_size} B)")
if small_rows:
    print(f"# tree or hier(rd) faster than the flat ring at sizes <= {small} B: "
          f"{'yes' if small_wins == small_rows else 'no'} ({small_wins} of {small_rows} sizes)")
PY
