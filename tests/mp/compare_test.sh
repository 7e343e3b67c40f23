#!/usr/bin/env bash
# bench/peers/compare.sh end to end on small sizes (shm2 and tcp2, 2 sweeps): it exits 0, prints
# its yardsticks (memcpy, xcore-bw), a table per configuration with a row per size (and tcp2's
# table beside the bare exchange, tcp-wire-perf), the same tables as markdown, and every time and ratio it prints is recomputed here from the runs' own
# logs (each library's best out-of-place and in-place time over the sweeps). A run of 64 MiB
# alone (-q: the fewest calls) checks the memcpy yardstick's two percentages against memcpy-bw's
# own log. Bad flags exit 2 with a message naming the flag. Peers that are not installed show as
# n/a and are not checked.
# usage: compare_test.sh SOURCE_DIR BUILD_DIR
# Exit status: 0 pass, 1 fail.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$1 build=$2
compare=$src/bench/peers/compare.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../check_lib.sh
source "$(dirname "$0")/../check_lib.sh"

timeout 600 "$compare" -c shm2,tcp2 -b 8 -e 32K -f 64 -r 2 -t 0.2 -o "$tmp/table.md" \
  -l "$tmp/logs" "$build" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -30 "$tmp/out"; fail "compare.sh exited with $rc"; }
grep -Eq '^# memcpy \(1 core, 64 MiB\): [0-9.]+ GB/s$' "$tmp/out" || fail "no memcpy yardstick line"
if [ "$(nproc)" -ge 2 ]; then
  grep -Eq "^# copies of 512 KiB: [0-9.]+ GB/s from another core's cache, [0-9.]+ within one, [0-9.]+ rewriting lines another core read, ([0-9.]+ GB/s|n/a) through process_vm_readv" \
    "$tmp/out" || fail "no xcore-bw line"
fi

# Every printed number against the logs.
python3 - "$tmp/out" "$tmp/table.md" "$tmp/logs" <<'EOF' || fail "tables do not match the logs"
import os, re, sys

out_path, md_path, logs = sys.argv[1:4]
sizes = {"8 B": 8, "512 B": 512, "32 KiB": 32768}
bad = []


def best(cfg, lib, size):
    """(best out-of-place us, best in-place us) over the sweeps, or None where the library
    did not run (not installed)."""
    path = os.path.join(logs, "%s.%s.%d.log" % (cfg, lib, size))
    if not os.path.exists(path):
        return None
    rows = [l.split() for l in open(path) if re.match(r"^\s+%d\s" % size, l)]
    if len(rows) != 2:
        bad.append("%s: %d result rows, expected 2 (one a sweep)" % (path, len(rows)))
        return None
    # The bare exchange has no in-place form (N/A).
    inplace = None if rows[0][9] == "N/A" else min(float(r[9]) for r in rows)
    return min(float(r[5]) for r in rows), inplace


def near(printed, value, what):
    """printed (a string: n/a, or a number rounded to its printed digits) against value."""
    if value is None:
        if printed != "n/a":
            bad.append("%s: printed %s where the library did not run" % (what, printed))
        return
    try:
        p = float(printed)
    except ValueError:
        bad.append("%s: %r is not a number (want %.4g)" % (what, printed, value))
        return
    digits = printed.split(".")[1] if "." in printed else ""
    if abs(p - value) > 0.5 * 10 ** -len(digits) + 1e-3 * abs(value) + 1e-12:
        bad.append("%s: printed %s, the logs give %.4g" % (what, printed, value))


def ratio(a, b):
    return None if a is None or b is None else a / b


text = open(out_path).read()
md = open(md_path).read()
for cfg in ("shm2", "tcp2"):
    sect = re.search(r"^## %s:.*?(?=^## |\Z)" % cfg, text, re.M | re.S)
    msect = re.search(r"^#### %s:.*?(?=^#### |\Z)" % cfg, md, re.M | re.S)
    if not sect or not msect:
        bad.append("%s: no table (text %s, markdown %s)" % (cfg, bool(sect), bool(msect)))
        continue
    rows = {}
    for line in sect.group(0).splitlines():
        cells = [c.split() for c in line.split("|")]
        label = " ".join(cells[0])
        # The main table's rows, the loomR table's (shm), the wire table's (tcp).
        if label in sizes and len(cells) in (7, 4, 5):
            rows.setdefault(label, []).append([x for c in cells[1:] for x in c])
    for label, size in sizes.items():
        got = rows.get(label, [])
        t = {lib: best(cfg, lib, size) for lib in ("loom", "ompi", "gloo", "loomR", "wire")}
        # The main table, then the loomMemAlloc table (shared memory) or, where tcp-wire-perf
        # is built, the bare exchange's (TCP).
        second = cfg.startswith("shm") or t["wire"] is not None
        if len(got) != (2 if second else 1):
            bad.append("%s %s: %d rows" % (cfg, label, len(got)))
            continue
        out_ = {k: (v[0] if v else None) for k, v in t.items()}
        in_ = {k: (v[1] if v else None) for k, v in t.items()}
        m = got[0]  # loom us, GB/s, ompi us, GB/s, gloo us, GB/s, bw l/ompi, bw l/gloo, t l/ompi, t l/gloo, in l/ompi
        w = "%s %s" % (cfg, label)
        near(m[0], out_["loom"], w + " loom us")
        near(m[2], out_["ompi"], w + " ompi us")
        near(m[4], out_["gloo"], w + " gloo us")
        near(m[6], ratio(out_["ompi"], out_["loom"]), w + " busbw loom/ompi")
        near(m[7], ratio(out_["gloo"], out_["loom"]), w + " busbw loom/gloo")
        near(m[8], ratio(out_["loom"], out_["ompi"]), w + " time loom/ompi")
        near(m[9], ratio(out_["loom"], out_["gloo"]), w + " time loom/gloo")
        near(m[10], ratio(in_["ompi"], in_["loom"]), w + " in place busbw loom/ompi")
        mdrow = re.search(r"^\| %s \| (.*) \|$" % re.escape(label), msect.group(0), re.M)
        if not mdrow or mdrow.group(1).split(" | ") != m:
            bad.append("%s: markdown row %s, text row %s" % (w, mdrow and mdrow.group(1), m))
        if cfg.startswith("shm"):
            r = got[1]  # loom us, GB/s, loomR us, GB/s, bw R/loom, bw R/ompi
            near(r[2], out_["loomR"], w + " loomR us")
            near(r[4], ratio(out_["loom"], out_["loomR"]), w + " busbw loomR/loom")
            near(r[5], ratio(out_["ompi"], out_["loomR"]), w + " busbw loomR/ompi")
        elif second:
            r = got[1]  # loom us, GB/s, wire us, GB/s, gloo GB/s, bw l/wire, bw w/gloo
            near(r[0], out_["loom"], w + " loom us (wire table)")
            near(r[2], out_["wire"], w + " wire us")
            near(r[5], ratio(out_["wire"], out_["loom"]), w + " busbw loom/wire")
            near(r[6], ratio(out_["gloo"], out_["wire"]), w + " busbw wire/gloo")
            mdrow = re.findall(r"^\| %s \| (.*) \|$" % re.escape(label), msect.group(0), re.M)
            if len(mdrow) != 2 or mdrow[1].split(" | ") != r:
                bad.append("%s: wire markdown rows %s, text row %s" % (w, mdrow, r))
    tail = ", wire (0|n/a)" if cfg.startswith("tcp") else ""
    if not re.search(r"^# Wrong results \(#wrong\): loom 0, ompi (0|n/a), gloo (0|n/a)" + tail,
                     sect.group(0), re.M):
        bad.append("%s: no all-zero wrong-results line" % cfg)
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
[ $failures -eq 0 ] && echo "PASS: shm2 and tcp2 tables, 3 sizes, every number against the logs"

# The 64 MiB yardstick: memcpy at the start, just before and just after the 64 MiB rotation, and
# at the end (memcpy.log, in that order); Loom's busbw there against the best of the first and
# last and against the best of the two beside it.
timeout 600 "$compare" -q -c shm2 -b 64M -e 64M -r 1 -t 0.1 -l "$tmp/logs64" "$build" \
  >"$tmp/out64" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -30 "$tmp/out64"; fail "compare.sh at 64 MiB exited with $rc"; }
python3 - "$tmp/out64" "$tmp/logs64" <<'EOF' || fail "the 64 MiB yardstick line does not match the logs"
import os, re, sys

out_path, logs = sys.argv[1:3]
memcpy = [float(l.split()[6]) for l in open(os.path.join(logs, "memcpy.log"))
          if l.startswith("memcpy-bw:")]
rows = [l.split() for l in open(os.path.join(logs, "shm2.loom.67108864.log"))
        if re.match(r"^\s+67108864\s", l)]
line = re.search(r"Loom busbw at 64 MiB: ([0-9.]+) GB/s = ([0-9.]+)% of one core's memcpy at the "
                 r"start and end \(([0-9.]+) GB/s\); ([0-9.]+)% of its memcpy beside the 64 MiB "
                 r"runs \(([0-9.]+) GB/s\)", open(out_path).read())
bad = []
if len(memcpy) != 4:
    bad.append("memcpy.log: %d runs, expected 4 (start, beside twice, end)" % len(memcpy))
if len(rows) != 1:
    bad.append("shm2.loom.67108864.log: %d result rows, expected 1" % len(rows))
if not line:
    bad.append("no yardstick line with both percentages")
if not bad:
    busbw = float(rows[0][7])
    ends, beside = max(memcpy[0], memcpy[3]), max(memcpy[1], memcpy[2])
    got = [float(x) for x in line.groups()]
    want = [busbw, 100 * busbw / ends, ends, 100 * busbw / beside, beside]
    for name, g, w in zip(("busbw", "% of start/end", "start/end memcpy", "% beside",
                           "memcpy beside"), got, want):
        if abs(g - w) > 0.051 + 1e-3 * abs(w):
            bad.append("%s: printed %s, the logs give %.3f" % (name, g, w))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
[ $failures -eq 0 ] && echo "PASS: the 64 MiB yardstick against memcpy at the ends and beside the runs"

# The bare exchange on a ring of 3 ranks (tcp4's shape: a connection each way): every row's busbw is
# algbw x 2(n-1)/n and algbw the size over the time, nothing wrong, and a bad -np is refused.
wire=$build/bench/peers/tcp-wire-perf
if [ -x "$wire" ]; then
  timeout 120 "$wire" -np 3 -b 4K -e 1M -f 16 -n 5 -w 1 >"$tmp/wire3" 2>&1 ||
    { tail -5 "$tmp/wire3"; fail "tcp-wire-perf -np 3 failed"; }
  python3 - "$tmp/wire3" <<'EOF' || fail "tcp-wire-perf -np 3: rows do not add up"
import re, sys
text = open(sys.argv[1]).read()
rows = [l.split() for l in text.splitlines() if re.match(r"^\s+[0-9]+\s", l)]
bad = []
if [int(r[0]) for r in rows] != [4096, 65536, 1048576]:
    bad.append("sizes %s" % [r[0] for r in rows])
for r in rows:
    size, us, algbw, busbw, wrong = int(r[0]), float(r[5]), float(r[6]), float(r[7]), r[8]
    if wrong != "0" or r[9] != "N/A":
        bad.append("%d: #wrong %s, in place %s" % (size, wrong, r[9]))
    if abs(algbw - size / us / 1e3) > 0.006 + 0.01 * algbw:
        bad.append("%d: algbw %s from %s us" % (size, algbw, us))
    if abs(busbw - algbw * 4 / 3) > 0.011:
        bad.append("%d: busbw %s, algbw %s" % (size, busbw, algbw))
if "# Out of bounds values : 0 OK" not in text:
    bad.append("no all-clear footer")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
  "$wire" -np 1 -b 4K -e 4K >/dev/null 2>"$tmp/wire1"
  rc=$?
  { [ $rc -eq 2 ] && grep -q -- "-np 1" "$tmp/wire1"; } ||
    fail "tcp-wire-perf -np 1: exit $rc, $(cat "$tmp/wire1")"
  [ $failures -eq 0 ] && echo "PASS: tcp-wire-perf on 3 ranks, rows against their own times"
fi

# Bad flags: exit 2, the flag named, nothing run.
for args in "-c bogus:-c" "-r 0:-r" "-f 1:-f" "-t abc:-t" "-T 0:-T" "-W x:-W" "-N abc:-N" \
            "-b 12Q:-b" "-b 1K -e 8:-b"; do
  flags=${args%%:*} want=${args##*:}
  # shellcheck disable=SC2086
  msg=$("$compare" $flags "$build" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "compare.sh $flags exited with $rc, expected 2"
  grep -q -- "$want" <<<"$msg" || fail "compare.sh $flags: message does not name $want: $msg"
done
[ $failures -eq 0 ] && echo "PASS: bad flags exit 2 and name the flag"
[ $failures -eq 0 ]
