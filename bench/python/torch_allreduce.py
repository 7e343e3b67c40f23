"""torch.distributed.all_reduce (float32, sum, in place) from Python on N local processes,
gloo and loom alternating, beside loom-perf (Loom's C benchmark) at the same sizes.

Each repetition starts every backend's process set once; a process set runs all sizes. Per
size each rank validates one all-reduce (rank r contributes r + 1 everywhere; any other sum is
an error), warms up, picks the calls per block from the warm-up's pace (about 0.1 s a block,
at most 1000 calls, the smallest pick of any rank), then times 3 blocks of back-to-back calls
on one tensor allocated for that size; a rank's time is the median block's mean per call, a
repetition's is its slowest rank's, and the table keeps the best repetition. loom-perf runs in
each repetition too, with the loom run's warm-up and call counts (-a 3: slowest rank's mean
per call). torch's all_reduce is in place, so "framework overhead" is loom-from-torch minus
loom-perf's in-place time, the same call from C; loom-perf's out-of-place time is shown
beside it (its buffers are loomMemAlloc memory, whose input the peers read in place where the
direct all-reduce takes its slices form, which an in-place call cannot).

usage: python bench/python/torch_allreduce.py [-np 2,4] [-b 8] [-e 64M] [-f 4]
           [--backends gloo,loom] [--reps 3] [--quick]
--quick: 3 sizes, few iterations, one repetition; exits 1 on any wrong sum (a CI smoke run).
"""

import statistics
import subprocess
import sys
import time

import _torch_ranks as tr

LOOM_PERF = tr.REPO / "build" / "loom-perf"


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def sizes_of(b, e, f):
    """b, b*f, ... up to e, and e itself when the steps miss it."""
    out, s = [], b
    while s <= e:
        out.append(s)
        s *= f
    if out[-1] != e:
        out.append(e)
    return out


def plan(size, quick):
    """(warm-up calls, seconds per timed block, most calls per block, blocks)"""
    if quick:
        return 3, 0.02, 20, 2
    return min(20, max(2, (16 << 20) // size)), 0.1, 1000, 3


def rank_body(rank, nprocs, sizes, quick):
    import torch
    import torch.distributed as dist

    expect = nprocs * (nprocs + 1) / 2
    out = {}
    for size in sizes:
        t = torch.full((max(1, size // 4),), float(rank + 1))
        dist.all_reduce(t)
        wrong = int((t != expect).sum())
        warm, block_s, most, blocks = plan(size, quick)
        t.zero_()  # zeros stay zeros under repeated in-place sums
        start = time.perf_counter()
        for _ in range(warm):
            dist.all_reduce(t)
        # calls per block from the warm-up's pace, the same on every rank (the smallest guess)
        pace = warm / (time.perf_counter() - start)
        n = torch.tensor([min(most, max(3, int(block_s * pace)))], dtype=torch.int64)
        dist.all_reduce(n, op=dist.ReduceOp.MIN)
        iters = int(n)
        sec = tr.block_median(lambda: dist.all_reduce(t), iters, blocks)
        if bool((t != 0).any()):
            wrong += 1
        out[size] = (sec * 1e6, wrong, iters * blocks, warm)
    return out


def loom_perf_us(nprocs, size, iters, warm):
    """loom-perf's (in place, out of place) times per call in us (slowest rank's mean) for one
    size, or None."""
    cmd = [str(LOOM_PERF), "-np", str(nprocs), "-b", str(size), "-e", str(size), "-d", "float",
           "-o", "sum", "-n", str(iters), "-w", str(warm), "-a", "3"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        tr.stderr_log("loom-perf timed out: " + " ".join(cmd))
        return None
    if r.returncode != 0:
        tr.stderr_log("loom-perf failed (%d): %s\n%s" % (r.returncode, " ".join(cmd),
                                                          r.stdout[-2000:] + r.stderr[-2000:]))
        return None
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 13 and not line.startswith("#") and f[0].isdigit() and int(f[0]) == size:
            try:
                return float(f[9]), float(f[5])
            except ValueError:
                return None
    return None


def run(nprocs, backends, sizes, args):
    reps = args.reps or (1 if args.quick else 3)
    with_perf = "loom" in backends and LOOM_PERF.exists() and not args.no_loom_perf
    if "loom" in backends and not LOOM_PERF.exists():
        tr.stderr_log("note: %s not found; no loom-perf columns" % LOOM_PERF)
    best = {b: {s: None for s in sizes} for b in backends}
    perf = {s: None for s in sizes}  # size: [in place, out of place]
    calls = {}  # size: (timed calls, warm-up calls) of the loom run, which loom-perf repeats
    wrong = 0
    for rep in range(reps):
        for b in backends:
            t = time.monotonic()
            ranks = tr.run_ranks(rank_body, nprocs, b, (sizes, args.quick), args.timeout)
            tr.stderr_log("  rep %d/%d %s np=%d: %.1f s" % (rep + 1, reps, b, nprocs,
                                                            time.monotonic() - t))
            for s in sizes:
                us = max(r[s][0] for r in ranks)
                bad = sum(r[s][1] for r in ranks)
                if bad:
                    print("WRONG: %s np=%d size %d: %d wrong values" % (b, nprocs, s, bad))
                    wrong += bad
                best[b][s] = us if best[b][s] is None else min(best[b][s], us)
                if b == "loom":
                    calls[s] = ranks[0][s][2:]
        if with_perf:
            for s in sizes:
                us = loom_perf_us(nprocs, s, *calls[s])
                if us is not None:
                    perf[s] = list(us) if perf[s] is None else [min(a, b)
                                                                 for a, b in zip(perf[s], us)]

    headers = ["size"] + ["%s (us)" % b for b in backends]
    both = "gloo" in backends and "loom" in backends
    if both:
        headers.append("loom/gloo speed")
    if with_perf:
        headers += ["loom-perf in place (us)", "framework overhead (us)", "loom/loom-perf time",
                    "loom-perf out of place (us)"]
    rows = []
    for s in sizes:
        row = [tr.fmt_bytes(s)] + [tr.fmt(best[b][s]) for b in backends]
        if both:
            row.append(tr.fmt(best["gloo"][s] / best["loom"][s], 2))
        if with_perf:
            p, oop = perf[s] or (None, None)
            row += [tr.fmt(p), tr.fmt(best["loom"][s] - p if p else None),
                    tr.fmt(best["loom"][s] / p if p else None, 2), tr.fmt(oop)]
        rows.append(row)
    print("\ntorch.distributed.all_reduce float32 sum, %d processes, best of %d reps, "
          "time per call (slowest rank)\n" % (nprocs, reps))
    tr.print_table(headers, rows)
    print()
    if both:
        speed = {s: best["gloo"][s] / best["loom"][s] for s in sizes}
        lo, hi = min(sizes, key=speed.get), max(sizes, key=speed.get)
        print("summary np=%d loom/gloo speed (gloo time / loom time): geomean %.2fx, "
              "min %.2fx at %s, max %.2fx at %s" % (nprocs, tr.geomean(speed.values()),
                                                    speed[lo], tr.fmt_bytes(lo), speed[hi],
                                                    tr.fmt_bytes(hi)))
    if with_perf:
        have = [s for s in sizes if perf[s]]
        if have:
            over = [best["loom"][s] - perf[s][0] for s in have]
            ratio = {s: best["loom"][s] / perf[s][0] for s in have}
            print("summary np=%d framework overhead (loom from torch - loom-perf in place): "
                  "median %.1f us, "
                  "%.1f to %.1f us; time ratio loom/loom-perf %.2fx at %s to %.2fx at %s" % (
                      nprocs, statistics.median(over), min(over), max(over), ratio[have[0]],
                      tr.fmt_bytes(have[0]), ratio[have[-1]], tr.fmt_bytes(have[-1])))
    sys.stdout.flush()
    return wrong


def main():
    p = tr.parser(__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--no-loom-perf", action="store_true", help="do not run loom-perf")
    args = p.parse_args()
    backends = tr.backends_of(args)
    if args.quick:
        sizes = [8, 32 << 10, 1 << 20]
    else:
        sizes = sizes_of(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    wrong = 0
    try:
        for n in tr.nprocs_of(args):
            wrong += run(n, backends, sizes, args)
    except tr.RankFailure as e:
        print("FAILED: %s" % e, file=sys.stderr)
        return 1
    if wrong:
        print("FAILED: %d wrong values" % wrong, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
