"""torch.distributed point to point from Python on 2 local processes, gloo and loom alternating:
a blocking send/recv ping-pong (one way = half a round trip), and an exchange in which both
ranks post irecv before the isend that answers the other's (the pattern a queue run strictly
in order would hold until its timeout).

Per size, rank 0's first message carries values the other rank checks (any other content is an
error), then each rank warms up and times 3 blocks of back-to-back round trips; a rank's time is
the median block's mean, a repetition's is rank 0's, and the table keeps the best repetition.

usage: python bench/python/torch_p2p.py [-b 8] [-e 4M] [-f 8] [--backends gloo,loom]
           [--reps 3] [--quick]
--quick: 3 sizes, few round trips, one repetition; exits 1 on any wrong value (a smoke run).
"""

import sys

import _torch_ranks as tr
from torch_allreduce import parse_size, sizes_of


def rank_body(rank, nprocs, sizes, quick):
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    out = {}
    for size in sizes:
        n = max(1, size // 4)
        t = torch.zeros(n)
        # Checked first: rank 0 sends 0, 1, 2, ...; rank 1 sends it back plus one.
        if rank == 0:
            dist.send(torch.arange(n, dtype=torch.float32), peer)
            dist.recv(t, peer)
            ok = bool(torch.equal(t, torch.arange(n, dtype=torch.float32) + 1))
        else:
            dist.recv(t, peer)
            ok = bool(torch.equal(t, torch.arange(n, dtype=torch.float32)))
            dist.send(t + 1, peer)
        if not ok:
            raise RuntimeError("rank %d: wrong values at %d bytes" % (rank, size))

        def ping():
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)

        got = torch.zeros(n)

        def exchange():
            r = dist.irecv(got, peer)
            s = dist.isend(t, peer)
            r.wait()
            s.wait()

        iters = 5 if quick else max(5, min(2000, (64 << 20) // size))
        row = {}
        for name, fn in (("ping", ping), ("exchange", exchange)):
            for _ in range(min(iters, 50)):
                fn()
            dist.barrier()
            row[name] = tr.block_median(fn, iters, 1 if quick else 3)
        out[size] = row
    return out


def main():
    p = tr.parser(__doc__.splitlines()[0], nprocs="2")
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="4M")
    p.add_argument("-f", type=int, default=8)
    args = p.parse_args()
    backends = tr.backends_of(args)
    if tr.nprocs_of(args) != [2]:
        sys.exit("torch_p2p.py: point to point runs on 2 processes (-np 2)")
    sizes = [8, 4096, 1 << 20] if args.quick else \
        sizes_of(parse_size(args.b), parse_size(args.e), args.f)
    reps = args.reps or (1 if args.quick else 3)
    try:
        runs = tr.alternate(backends, reps, rank_body, 2, (sizes, args.quick), args.timeout,
                            tr.stderr_log)
    except tr.RankFailure as e:
        print("torch_p2p: %s" % e, file=sys.stderr)
        return 1
    best = {b: {s: {k: min(rep[0][s][k] for rep in runs[b]) for k in ("ping", "exchange")}
                for s in sizes} for b in backends}
    headers = ["size"]
    for k in ("ping", "exchange"):
        headers += ["%s %s (us)" % (b, k) for b in backends]
        if len(backends) == 2:
            headers.append("%s loom/gloo time" % k)
    rows = []
    for s in sizes:
        row = [tr.fmt_bytes(s)]
        for k in ("ping", "exchange"):
            # ping: one way, half the round trip; exchange: one irecv + isend pair, both waited
            us = {b: best[b][s][k] * 1e6 / (2 if k == "ping" else 1) for b in backends}
            row += [tr.fmt(us[b]) for b in backends]
            if len(backends) == 2:
                row.append(tr.fmt(us["loom"] / us["gloo"], 2))
        rows.append(row)
    print("torch point to point, 2 processes, %d repetition(s), best kept; ping: one way of a "
          "blocking send/recv round trip; exchange: irecv then isend on both ranks, both waited"
          % reps)
    tr.print_table(headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
