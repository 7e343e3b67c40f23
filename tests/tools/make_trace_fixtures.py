#!/usr/bin/env python3
"""Writes the flight-recorder dumps in tests/data/trace/ that loom-trace's
command-line and HTML tests read. Deterministic: run it again after changing
it and commit the result.

    tests/tools/make_trace_fixtures.py [OUT_DIR]   (default: tests/data/trace)

Each folder is one situation; the tests know what loom-trace must say:
  straggler/   4 ranks, 30 all-reduces; rank 3 enters 5 ms late when seq % 3 == 0
               (ranks' clocks offset from rank 0's; rank 1's dump has no clock fields;
               ranks 0 and 2 carry "arrivals" lists on even sequence numbers)
  missing/     3 ranks, 8 all-reduces; rank 1 stopped after seq 7, the others timed out in 8
  mismatch/    2 ranks; at seq 4 rank 1 called a broadcast where rank 0 called an all-reduce
  stuck/       3 ranks; rank 2 is still in seq 6, which ranks 0 and 1 completed
  incomplete/  3 ranks, dumps from ranks 0 and 1 only
  twocomms/    two communicators ("model" and "data") in one folder, both consistent
  malformed/   rank 1's dump is cut off in the middle
"""
import json
import os
import sys

MS = 1_000_000
US = 1_000


def op(seq, enter, end, coll="allreduce", count=1024, dtype=7, red=0, root=-1,
       state="completed", error=None, arrivals=None):
    o = {"seq": seq, "coll": coll, "algorithm": "direct", "proto": "LL", "count": count,
         "dtype": dtype, "op": red, "root": root, "state": state, "enterNs": enter,
         "endNs": end, "waitNs": 0, "waitPeer": -1, "maxWaitNs": 0, "lastRank": -1,
         "lateNs": 0}
    if error:
        o["error"] = error
    if arrivals is not None:
        o["arrivals"] = arrivals
    return o


def dump(rank, nranks, ops, comm="fixture", hashed="00000000f1f1f1f1", reason="timeout",
         offset=0, error_ns=0, clock_fields=True):
    d = {"rank": rank, "nranks": nranks, "comm": comm, "commHash": hashed, "reason": reason,
         "clock": "CLOCK_MONOTONIC", "lastCompletedSeq": 0, "ops": ops}
    if clock_fields:
        d["clockOffsetNs"] = offset
        d["clockErrorNs"] = error_ns
    return d


def entries(nranks, nops, late_rank=None, late_ns=0, late_when=lambda s: False):
    """Entry times in rank 0's clock, seq -> [per rank], with a fixed small jitter."""
    out = {}
    t = 10 * MS
    for seq in range(1, nops + 1):
        row = [t + ((seq * 37 + q * 11) % 40) * US for q in range(nranks)]
        if late_rank is not None and late_when(seq):
            row[late_rank] += late_ns
        out[seq] = row
        t = max(row) + 2 * MS
    return out


def simple(nranks, nops, **kw):
    """Every rank's dump of nops completed all-reduces, no clock offsets."""
    e = entries(nranks, nops)
    return [dump(q, nranks, [op(s, e[s][q], max(e[s]) + 300 * US) for s in e], **kw)
            for q in range(nranks)]


def straggler():
    n = 4
    e = entries(n, 30, late_rank=3, late_ns=5 * MS, late_when=lambda s: s % 3 == 0)
    offsets = [0, 0, -3_000_000_000, 7_500_000_000]  # rank 1: no clock fields at all
    dumps = []
    for q in range(n):
        ops = []
        for s, row in e.items():
            arr = row if q in (0, 2) and s % 2 == 0 else None
            end = max(row) + 300 * US
            ops.append(op(s, row[q] - offsets[q], end - offsets[q], arrivals=arr))
        dumps.append(dump(q, n, ops, reason="destroy", offset=offsets[q],
                          clock_fields=q != 1))
    return dumps


def missing():
    n = 3
    e = entries(n, 8)
    dumps = []
    for q in range(n):
        ops = []
        for s, row in e.items():
            if q == 1 and s == 8:
                continue
            if s == 8:
                ops.append(op(s, row[q], row[q] + 2000 * MS, state="failed",
                              error="rank %d: allreduce #8 timed out after 2 s waiting for rank 1"
                              % q))
            else:
                ops.append(op(s, row[q], max(row) + 300 * US))
        dumps.append(dump(q, n, ops, reason="timeout" if q != 1 else "request"))
    return dumps


def mismatch():
    dumps = simple(2, 5)
    o = dumps[1]["ops"][3]
    o["coll"], o["root"], o["algorithm"] = "broadcast", 0, "chain"
    for d in dumps:
        d["ops"][3]["state"], d["ops"][3]["endNs"] = "failed", d["ops"][3]["enterNs"] + 2000 * MS
        d["ops"][3]["error"] = "timed out"
        del d["ops"][4:]
    return dumps


def stuck():
    dumps = simple(3, 6)
    dumps[2]["ops"][5]["state"], dumps[2]["ops"][5]["endNs"] = "started", 0
    dumps[2]["reason"] = "SIGUSR1"
    return dumps


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "trace")
    sets = {
        "straggler": straggler(),
        "missing": missing(),
        "mismatch": mismatch(),
        "stuck": stuck(),
        "incomplete": simple(3, 4)[:2],
        "twocomms": simple(2, 3, comm="model", hashed="000000000000aaaa")
        + simple(3, 2, comm="data", hashed="000000000000bbbb"),
        "malformed": simple(2, 3),
    }
    for name, dumps in sets.items():
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        for d in dumps:
            path = os.path.join(folder, "loom-trace-%s-rank%d.json" % (d["commHash"], d["rank"]))
            text = json.dumps(d, separators=(",", ":")) + "\n"
            if name == "malformed" and d["rank"] == 1:
                text = text[: len(text) // 2]
            with open(path, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
