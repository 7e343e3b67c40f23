"""Tensor-parallel decode latency per token on N local CPU processes, gloo and loom alternating,
eager and under torch.compile.

The model is a stack of pre-norm transformer blocks (q/k/v/o attention projections with a KV
cache, then a GELU MLP) whose projections are split with DTensor's parallelize_module over a
1-D CPU DeviceMesh: q, k, v and fc1 ColwiseParallel (each rank holds its heads and its slice of
the MLP), o and fc2 RowwiseParallel (an all-reduce of d_model floats each, so two per block
per token). Decoding runs batch 1, one token per step, with inputs fed from a fixed random
sequence; each timed block starts from an empty KV cache and decodes `steps` tokens. The
cache has a fixed length (each step writes its position with index_copy_ and attends through
a causal mask row), so that one compiled graph serves every position.

Modes: eager runs the parallelized model as it is (DTensor's dispatch in Python on every
projection); compiled runs torch.compile(model, fullgraph=True) (inductor), whose graph calls
the functional collectives (_c10d_functional.all_reduce_, wait_tensor) on the backend. The
unsharded model runs in the same mode.

Every rank also holds an unsharded copy of the model. A first pass decodes `steps` tokens with
both (in compiled mode it also compiles them), and every tensor-parallel output must match the
unsharded one (allclose, rtol 1e-4, atol 1e-5; a mismatch exits 1). Then timed blocks of the
two alternate, all ranks at once, so the unsharded column is the latency without tensor
parallelism under the same load of N processes. A rank's latency is the median block's mean
per token, a process set's its slowest rank's, and the table keeps the best repetition.

usage: python bench/python/torch_tp_decode.py [-np 2] [--layers 4] [--dim 512]
           [--modes eager,compiled] [--backends gloo,loom] [--reps 3] [--quick]
--quick: 2 layers, 16 tokens per block, 2 blocks, one repetition.
"""

import statistics
import sys
import time

import _torch_ranks as tr


def make_model(dim, heads, layers, max_len):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = dim // heads
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def heads(self, t):  # (1, 1, local features) -> (1, local heads, 1, head_dim)
            return t.view(1, 1, -1, self.head_dim).transpose(1, 2)

        def forward(self, x, pos, mask, ck, cv):
            """pos: a one-element int64 tensor; mask: (1, 1, 1, max_len) bool, True up to pos;
            ck, cv: this block's key and value caches, (1, local heads, max_len, head_dim)."""
            h = self.ln1(x)
            q, k, v = self.heads(self.q(h)), self.heads(self.k(h)), self.heads(self.v(h))
            ck.index_copy_(2, pos, k)
            cv.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, ck, cv, attn_mask=mask)
            x = x + self.o(a.transpose(1, 2).reshape(1, 1, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))

        def forward(self, x, pos, mask, caches):
            for b, (ck, cv) in zip(self.blocks, caches):
                x = b(x, pos, mask, ck, cv)
            return x

    torch.manual_seed(4321)
    return Stack()


def plan(quick):
    """(tokens per block, blocks)"""
    return (16, 2) if quick else (64, 5)


def rank_body(rank, nprocs, dim, heads, layers, quick, modes):
    import copy

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    steps, blocks = plan(quick)
    model = make_model(dim, heads, layers, steps).eval()
    reference = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (nprocs,))
    plan_ = {}
    for i in range(layers):
        for name in ("q", "k", "v", "fc1"):
            plan_["blocks.%d.%s" % (i, name)] = ColwiseParallel()
        for name in ("o", "fc2"):
            plan_["blocks.%d.%s" % (i, name)] = RowwiseParallel()
    model = parallelize_module(model, mesh, plan_)
    tokens = torch.randn(steps, 1, 1, dim, generator=torch.Generator().manual_seed(7))
    positions = [torch.tensor([p]) for p in range(steps)]
    masks = torch.tril(torch.ones(steps, steps, dtype=torch.bool)).view(steps, 1, 1, 1, steps)
    caches = {  # allocated and touched once; each block starts them from zeros
        name: [(torch.zeros(1, h, steps, dim // heads), torch.zeros(1, h, steps, dim // heads))
               for _ in range(layers)]
        for name, h in (("tp", heads // nprocs), ("unsharded", heads))}

    def decode(m, name):
        """Decodes `steps` tokens from an empty cache; returns the outputs."""
        for pair in caches[name]:
            for c in pair:
                c.zero_()
        return [m(tokens[p], positions[p], masks[p], caches[name]) for p in range(steps)]

    out = {}
    with torch.no_grad():
        for mode in modes:
            run = {"tp": model, "unsharded": reference}
            if mode == "compiled":
                run = {k: torch.compile(m, fullgraph=True) for k, m in run.items()}
            worst = 0.0  # the check pass also compiles and warms both models up
            for y, want in zip(decode(run["tp"], "tp"), decode(run["unsharded"], "unsharded")):
                if not torch.allclose(y, want, rtol=1e-4, atol=1e-5):
                    diff = float((y - want).abs().max())
                    worst = max(worst, diff) if diff == diff else float("inf")
            times = {"tp": [], "unsharded": []}
            for _ in range(blocks):  # tensor-parallel and unsharded blocks alternate
                for name in ("tp", "unsharded"):
                    t = time.perf_counter()
                    decode(run[name], name)
                    times[name].append((time.perf_counter() - t) / steps * 1e6)
            out[mode] = {k: statistics.median(v) for k, v in times.items()} | {"mismatch": worst}
    return out


def main():
    p = tr.parser(__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=512, help="d_model (MLP 4x, 64-wide heads)")
    p.add_argument("--modes", default="eager,compiled",
                   help="comma list of eager,compiled (default both)")
    args = p.parse_args()
    backends = tr.backends_of(args)
    modes = args.modes.split(",")
    for m in modes:
        if m not in ("eager", "compiled"):
            sys.exit("unknown mode %r (expected some of eager,compiled)" % m)
    layers = 2 if args.quick and args.layers == 4 else args.layers
    heads = args.dim // 64
    reps = args.reps or (1 if args.quick else 3)
    rows, ratios, bad = [], {}, 0
    try:
        for n in tr.nprocs_of(args):
            if heads % n:
                sys.exit("%d heads do not split over %d processes" % (heads, n))
            res = tr.alternate(backends, reps, rank_body, n,
                               (args.dim, heads, layers, args.quick, modes), args.timeout,
                               tr.stderr_log)
            for mode in modes:
                best, plain = {}, []
                for b in backends:
                    for rep in res[b]:
                        worst = max(r[mode]["mismatch"] for r in rep)
                        if worst:
                            print("MISMATCH: %s np=%d %s: tensor-parallel output differs from "
                                  "the unsharded model's by up to %g" % (b, n, mode, worst))
                            bad += 1
                    best[b] = min(max(r[mode]["tp"] for r in rep) for rep in res[b])
                    plain.append(min(max(r[mode]["unsharded"] for r in rep) for rep in res[b]))
                row = [str(n), mode] + [tr.fmt(best[b]) for b in backends]
                if "gloo" in backends and "loom" in backends:
                    ratios[n, mode] = best["loom"] / best["gloo"]
                    row.append(tr.fmt(ratios[n, mode], 2))
                rows.append(row + [tr.fmt(min(plain))])
    except tr.RankFailure as e:
        print("FAILED: %s" % e, file=sys.stderr)
        return 1
    print("\nTensor-parallel decode, %d layers, d_model %d, %d heads, MLP %d, batch 1, "
          "%d all-reduces of %d B per token; best of %d reps, slowest rank; every rank's "
          "outputs checked against the unsharded model\n"
          % (layers, args.dim, heads, 4 * args.dim, 2 * layers, 4 * args.dim, reps))
    headers = ["np", "mode"] + ["%s TP (us/token)" % b for b in backends]
    if ratios:
        headers.append("loom/gloo time")
    tr.print_table(headers + ["unsharded, every rank at once (us/token)"], rows)
    print()
    for (n, mode), r in ratios.items():
        print("summary np=%d %s loom/gloo decode time (loom latency / gloo latency): %.2f"
              % (n, mode, r))
    if bad:
        print("FAILED: %d mismatches against the unsharded model" % bad, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
