"""DistributedDataParallel training step time on N local CPU processes, gloo and loom
alternating, and the share of the step that communication adds.

Models (float32, SGD, cross-entropy on random data, a different batch per rank):
  mlp       4 x Linear(1024, 1024), batch 64: compute-heavy
  mlp-comm  3 x Linear(2048, 2048), batch 2: 12.6 M parameters and little compute, so the
            gradient all-reduce dominates (the communication-bound configuration)
  tfm       nn.TransformerEncoder, 2 layers, d_model 256, 4 heads, ff 1024, batch 8 x 64 tokens

In each process set every rank times blocks of compute-only steps (the same model without DDP,
all ranks stepping at once so that they compete for the cores as under DDP) alternating with
blocks of DDP steps. A rank's time per mode is the median of its blocks' mean step time, a
process set's is its slowest rank's, the table keeps the best repetition.
comm share = 1 - compute-only step / DDP step.
After the DDP steps each rank returns the sum of |parameter - initial parameter|: ranks of one
set must agree exactly (DDP replicas stay identical), and gloo and loom (same seeds, same data)
to within 1e-3 relative.

usage: python bench/python/torch_train.py [-np 2,4] [--models mlp,mlp-comm,tfm]
           [--backends gloo,loom] [--reps 3] [--quick]
--quick: 2 processes, 2 short blocks, one repetition.
"""

import statistics
import sys

import _torch_ranks as tr

MODELS = ("mlp", "mlp-comm", "tfm")


SHAPES = {  # name: (width or d_model, depth, batch, sequence length or None, classes)
    "mlp": (1024, 4, 64, None, 1024),
    "mlp-comm": (2048, 3, 2, None, 2048),
    "tfm": (256, 2, 8, 64, 512),
}


def build(name):
    """The model, its weights seeded alike on every rank."""
    import torch
    import torch.nn as nn

    width, depth, _, seq, classes = SHAPES[name]
    torch.manual_seed(1234)
    if seq is None:
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers[:-1])
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, depth, enable_nested_tensor=False),
                         nn.Linear(width, classes))


def batches(name, g, k):
    """k random (input, target) batches drawn from generator g."""
    import torch

    width, _, batch, seq, classes = SHAPES[name]
    shape = (batch,) if seq is None else (batch, seq)
    return [(torch.randn(*shape, width, generator=g), torch.randint(0, classes, shape, generator=g))
            for _ in range(k)]


def plan(quick):
    """(warm-up steps, steps per block, blocks)"""
    return (2, 3, 2) if quick else (3, 10, 3)


def rank_body(rank, nprocs, models, quick):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    warm, steps, blocks = plan(quick)
    out = {}
    for name in models:
        g = torch.Generator().manual_seed(100 + rank)
        data = batches(name, g, 4)
        steppers = {}
        for mode in ("compute", "ddp"):
            model = build(name)
            if mode == "ddp":
                model = DDP(model)
                start = [p.detach().clone() for p in model.parameters()]
            steppers[mode] = _stepper(model, data)
        for fn in steppers.values():
            for _ in range(warm):
                fn()
        times = {mode: [] for mode in steppers}
        for _ in range(blocks):  # blocks of the two modes alternate
            for mode, fn in steppers.items():
                times[mode].append(tr.block_median(fn, steps, 1) * 1e3)
        res = {mode: statistics.median(t) for mode, t in times.items()}
        res["checksum"] = float(sum((p.detach() - p0).double().abs().sum()
                                    for p, p0 in zip(model.parameters(), start)))
        out[name] = res
    return out


def _stepper(model, data):
    """One SGD step on the next batch of `data` per call."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    i = [0]

    def step():
        x, y = data[i[0] % len(data)]
        i[0] += 1
        opt.zero_grad()
        z = model(x)
        F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1)).backward()
        opt.step()
    return step


def run(nprocs, backends, models, args):
    reps = args.reps or (1 if args.quick else 3)
    res = tr.alternate(backends, reps, rank_body, nprocs, (models, args.quick), args.timeout,
                       tr.stderr_log)
    bad = 0
    best = {}
    for b in backends:
        for m in models:
            for rep in res[b]:
                sums = [r[m]["checksum"] for r in rep]
                if len(set(sums)) != 1:
                    print("MISMATCH: %s np=%d %s: ranks' parameter updates differ: %s "
                          "(sum |p - p0| per rank)" % (b, nprocs, m, sums))
                    bad += 1
            ddp = min(max(r[m]["ddp"] for r in rep) for rep in res[b])
            comp = min(max(r[m]["compute"] for r in rep) for rep in res[b])
            best[b, m] = (ddp, comp, res[b][0][0][m]["checksum"])
    if "gloo" in backends and "loom" in backends:
        for m in models:
            a, c = best["gloo", m][2], best["loom", m][2]
            if abs(a - c) > 1e-3 * abs(a):
                print("MISMATCH: np=%d %s: gloo and loom trained different parameters "
                      "(checksums %.6f, %.6f)" % (nprocs, m, a, c))
                bad += 1

    both = "gloo" in backends and "loom" in backends
    rows = []
    for m in models:
        row = [m, str(nprocs)]
        for b in backends:
            ddp, comp, _ = best[b, m]
            row += [tr.fmt(ddp, 2), tr.fmt(comp, 2), "%.0f%%" % (100 * (1 - comp / ddp))]
        if both:
            row.append(tr.fmt(best["gloo", m][0] / best["loom", m][0], 2))
        rows.append(row)
    return rows, best, bad


def main():
    p = tr.parser(__doc__.split("\n")[0], nprocs="2,4")
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    backends = tr.backends_of(args)
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            sys.exit("unknown model %r (expected some of %s)" % (m, ",".join(MODELS)))
    nps = [2] if args.quick and args.nprocs == "2,4" else tr.nprocs_of(args)
    rows, bests, bad = [], {}, 0
    try:
        for n in nps:
            r, best, b = run(n, backends, models, args)
            rows += r
            bests[n] = best
            bad += b
    except tr.RankFailure as e:
        print("FAILED: %s" % e, file=sys.stderr)
        return 1
    reps = args.reps or (1 if args.quick else 3)
    print("\nDDP training step on CPU, best of %d reps, slowest rank; comm share = "
          "1 - compute-only step / DDP step\n" % reps)
    tr.print_table(["model", "np"] + _headers(backends), rows)
    print()
    if "gloo" in backends and "loom" in backends:
        for n in nps:
            sp = {m: bests[n]["gloo", m][0] / bests[n]["loom", m][0] for m in models}
            print("summary np=%d loom/gloo DDP step speed (gloo step / loom step): %s; geomean "
                  "%.2fx" % (n, ", ".join("%s %.2fx" % (m, sp[m]) for m in models),
                             tr.geomean(sp.values())))
    for b in backends:
        for n in nps:
            print("summary np=%d %s comm share: %s" % (n, b, ", ".join(
                "%s %.0f%%" % (m, 100 * (1 - bests[n][b, m][1] / bests[n][b, m][0]))
                for m in models)))
    if bad:
        print("FAILED: %d checksum mismatches" % bad, file=sys.stderr)
        return 1
    return 0


def _headers(backends):
    out = []
    for b in backends:
        out += ["%s step (ms)" % b, "%s compute (ms)" % b, "%s comm share" % b]
    if "gloo" in backends and "loom" in backends:
        out.append("loom/gloo step speed")
    return out


if __name__ == "__main__":
    sys.exit(main())
