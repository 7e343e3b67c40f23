"""Every collective of torch.distributed on the process group in use, checked against
values this rank computes from every rank's known inputs (inputs are small integers, so
every sum, average and product is exact in every dtype and equality is bitwise).

check() returns {"checks": N, "failures": [...], "errors": {name: text}}: a failure is a
wrong value; an error is a call that raised (gloo raises for what it does not offer; the
test says which errors each backend may have)."""

import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor & co.
warnings.filterwarnings("ignore", category=UserWarning)

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64, torch.int8, torch.uint8)
DTYPES = FLOATS + INTS
N = 10          # elements of the small tensors
BIG = 70001     # elements of the large ones: several transport slots, odd size


def name(dt):
    return str(dt).replace("torch.", "")


def val(r, n, dt, shift=0):
    """Rank r's input: small integers (in [-3, 7], or [0, 10] unsigned)."""
    x = (torch.arange(n, dtype=torch.int64) * 7 + 3 * r + shift) % 11
    return (x if dt == torch.uint8 else x - 3).to(dt)


def pval(r, n, dt):
    """Rank r's input to a product: ones and twos."""
    return (1 + (torch.arange(n) + r) % 2).to(dt)


def stack(tensors):
    """The tensors stacked in float64, to reduce along dim 0 exactly."""
    return torch.stack([t.double() for t in tensors])


def chunk(t, i, k):
    """The i-th block of k elements of t."""
    return t[i * k:(i + 1) * k]


class Checker:
    def __init__(self):
        self.checks, self.failures, self.errors = 0, [], {}

    def expect(self, what, got, want):
        self.checks += 1
        got = got.detach()
        want = want.to(got.dtype) if isinstance(want, torch.Tensor) else \
            torch.tensor(want, dtype=got.dtype)
        if got.shape != want.shape or not torch.equal(got.double(), want.double()):
            self.failures.append("%s: got %s want %s" % (what, got.reshape(-1)[:8].tolist(),
                                                          want.reshape(-1)[:8].tolist()))

    def run(self, what, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001  recorded; the test decides
            self.errors[what] = ("%s: %s" % (type(e).__name__, e))[:400]


def check():
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker()

    def every(n, dt, s=0):  # every rank's input
        return [val(r, n, dt, s) for r in range(world)]

    def total(n, dt, s=0):
        return stack(every(n, dt, s)).sum(0)

    for dt in DTYPES:
        dn = name(dt)
        ins = stack(every(N, dt))
        refs = {"sum": ins.sum(0), "min": ins.min(0).values, "max": ins.max(0).values}
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        if dt in FLOATS:
            refs["avg"], ops["avg"] = ins.mean(0), dist.ReduceOp.AVG
            refs["premul_sum"], ops["premul_sum"] = ins.sum(0) * 2, dist._make_nccl_premul_sum(2.0)
        for op in ops:
            def ar(op=op):
                t = val(rank, N, dt)
                dist.all_reduce(t, op=ops[op])
                c.expect("all_reduce %s %s" % (op, dn), t, refs[op])
            c.run("all_reduce %s %s" % (op, dn), ar)

        def product():
            t = pval(rank, N, dt)
            dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
            c.expect("all_reduce product " + dn, t, stack(pval(r, N, dt) for r in range(world)).prod(0))
        c.run("all_reduce product " + dn, product)

        def async_ops():
            # Three in flight at once, waited in reverse order, one through its future.
            ts = [val(rank, N, dt, s) for s in range(3)]
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            fut = works[0].get_future()
            for w in works[:0:-1]:
                w.wait()
            got = fut.wait()
            got = got[0] if isinstance(got, list) else got
            c.expect("async all_reduce %s future" % dn, got, total(N, dt, 0))
            for s in range(3):
                c.expect("async all_reduce %s #%d" % (dn, s), ts[s], total(N, dt, s))
            works[0].wait()  # a future can complete before its Work says so (gloo)
            c.expect("async all_reduce %s is_completed" % dn,
                     torch.tensor([w.is_completed() for w in works]), [True] * 3)
        c.run("async all_reduce " + dn, async_ops)

        def coalesced():
            ts = [val(rank, N, dt), val(rank, 3, dt, 5)]
            dist.all_reduce_coalesced(ts)
            c.expect("all_reduce_coalesced %s [0]" % dn, ts[0], total(N, dt))
            c.expect("all_reduce_coalesced %s [1]" % dn, ts[1], total(3, dt, 5))
        c.run("all_reduce_coalesced " + dn, coalesced)

        def gathers():
            outs = [torch.zeros(N, dtype=dt) for _ in range(world)]
            dist.all_gather(outs, val(rank, N, dt))
            c.expect("all_gather " + dn, torch.stack(outs), torch.stack(every(N, dt)))
        c.run("all_gather " + dn, gathers)

        def gather_tensor():
            out = torch.zeros(world * N, dtype=dt)
            w = dist.all_gather_into_tensor(out, val(rank, N, dt), async_op=True)
            w.wait()
            c.expect("all_gather_into_tensor " + dn, out, torch.cat(every(N, dt)))
            out = torch.zeros(world * N, dtype=dt)
            dist.all_gather_single(out, val(rank, N, dt, 1))
            c.expect("all_gather_single " + dn, out, torch.cat(every(N, dt, 1)))
        c.run("all_gather_into_tensor " + dn, gather_tensor)

        def gather_stacked():  # output (world, N), as NCCL allows (gloo does not)
            out = torch.zeros(world, N, dtype=dt)
            dist.all_gather_into_tensor(out, val(rank, N, dt, 2))
            c.expect("all_gather_into_tensor stacked " + dn, out, torch.stack(every(N, dt, 2)))
        c.run("all_gather_into_tensor stacked " + dn, gather_stacked)

        def rs_list():
            out = torch.zeros(N, dtype=dt)
            dist.reduce_scatter(out, [val(rank, N, dt, j) for j in range(world)])
            c.expect("reduce_scatter " + dn, out, total(N, dt, rank))
        c.run("reduce_scatter " + dn, rs_list)

        def rs_uneven():  # rank j's block has j + 2 elements (gloo takes such lists too)
            out = torch.zeros(rank + 2, dtype=dt)
            dist.reduce_scatter(out, [val(rank, j + 2, dt, j) for j in range(world)])
            c.expect("reduce_scatter uneven " + dn, out, total(rank + 2, dt, rank))
        c.run("reduce_scatter uneven " + dn, rs_uneven)

        def rs_tensor():
            out = torch.zeros(3, dtype=dt)
            w = dist.reduce_scatter_tensor(out, val(rank, 3 * world, dt), async_op=True)
            w.wait()
            c.expect("reduce_scatter_tensor " + dn, out, chunk(total(3 * world, dt), rank, 3))
            out = torch.zeros(3, dtype=dt)
            dist.reduce_scatter_tensor(out, val(rank, 3 * world, dt), op=dist.ReduceOp.MAX)
            want = chunk(stack(every(3 * world, dt)).max(0).values, rank, 3)
            c.expect("reduce_scatter_tensor max " + dn, out, want)
        c.run("reduce_scatter_tensor " + dn, rs_tensor)

        def rs_tensor_scaled(op):  # as FSDP2 reduces gradients: AVG, or PREMUL_SUM(1 / factor)
            out = torch.zeros(3, dtype=dt)
            red = dist.ReduceOp.AVG if op == "avg" else dist._make_nccl_premul_sum(0.5)
            dist.reduce_scatter_tensor(out, val(rank, 3 * world, dt, 1), op=red)
            want = chunk(total(3 * world, dt, 1), rank, 3) / (world if op == "avg" else 2)
            c.expect("reduce_scatter_tensor %s %s" % (op, dn), out, want)
        if dt in FLOATS:
            for op in ("avg", "premul_sum"):
                c.run("reduce_scatter_tensor %s %s" % (op, dn), lambda op=op: rs_tensor_scaled(op))

        def rooted():
            for root in range(world):
                t = val(rank, N, dt)
                dist.broadcast(t, src=root)
                c.expect("broadcast %s root %d" % (dn, root), t, val(root, N, dt))
                t = val(rank, N, dt)
                dist.reduce(t, dst=root)
                if rank == root:
                    c.expect("reduce %s root %d" % (dn, root), t, total(N, dt))
                t = val(rank, N, dt)
                dist.reduce(t, dst=root, op=dist.ReduceOp.MIN)
                if rank == root:
                    c.expect("reduce min %s root %d" % (dn, root), t, stack(every(N, dt)).min(0).values)
        c.run("broadcast/reduce " + dn, rooted)

        def gather_scatter():
            for root in range(world):
                parts = [torch.zeros(4, dtype=dt) for _ in range(world)] if rank == root else None
                dist.gather(val(rank, 4, dt, root), parts, dst=root)
                if rank == root:
                    c.expect("gather %s root %d" % (dn, root), torch.stack(parts),
                             torch.stack(every(4, dt, root)))
                got = torch.zeros(5, dtype=dt)
                src = [val(j, 5, dt, root) for j in range(world)] if rank == root else None
                dist.scatter(got, src, src=root)
                c.expect("scatter %s root %d" % (dn, root), got, val(rank, 5, dt, root))
        c.run("gather/scatter " + dn, gather_scatter)

        def alltoall_list():
            outs = [torch.zeros(3, dtype=dt) for _ in range(world)]
            dist.all_to_all(outs, [val(rank, 3, dt, j) for j in range(world)])
            c.expect("all_to_all " + dn, torch.stack(outs),
                     torch.stack([val(r, 3, dt, rank) for r in range(world)]))
        c.run("all_to_all " + dn, alltoall_list)

        def alltoall_single():
            out = torch.zeros(world * 2, dtype=dt)
            dist.all_to_all_single(out, val(rank, world * 2, dt))
            c.expect("all_to_all_single " + dn, out,
                     torch.cat([chunk(val(r, world * 2, dt), rank, 2) for r in range(world)]))

            # Unequal splits, rows of 2: rank i sends rank j i + j + 1 rows (some rank sends 1).
            def rows(i, j):
                return i + j + 1

            def send(i):
                return val(i, 2 * sum(rows(i, j) for j in range(world)), dt).view(-1, 2)

            def part(i, j):  # what rank i sends rank j
                return send(i)[sum(rows(i, k) for k in range(j)):][:rows(i, j)]
            out = torch.zeros(sum(rows(r, rank) for r in range(world)), 2, dtype=dt)
            w = dist.all_to_all_single(out, send(rank), async_op=True,
                                       output_split_sizes=[rows(r, rank) for r in range(world)],
                                       input_split_sizes=[rows(rank, j) for j in range(world)])
            w.wait()
            c.expect("all_to_all_single splits " + dn, out,
                     torch.cat([part(r, rank) for r in range(world)]))
        c.run("all_to_all_single " + dn, alltoall_single)

        def p2p():
            nxt, prev = (rank + 1) % world, (rank - 1) % world
            got = torch.zeros(N, dtype=dt)
            if rank % 2 == 0:
                dist.send(val(rank, N, dt, 9), nxt)
                dist.recv(got, prev)
            else:
                dist.recv(got, prev)
                dist.send(val(rank, N, dt, 9), nxt)
            c.expect("send/recv " + dn, got, val(prev, N, dt, 9))
            got = torch.zeros(N, dtype=dt)
            works = [dist.isend(val(rank, N, dt, 4), nxt), dist.irecv(got, prev)]
            for w in works:
                w.wait()
            c.expect("isend/irecv " + dn, got, val(prev, N, dt, 4))
            a, b = torch.zeros(N, dtype=dt), torch.zeros(N, dtype=dt)
            ops = [dist.P2POp(dist.isend, val(rank, N, dt, 1), nxt), dist.P2POp(dist.irecv, a, prev),
                   dist.P2POp(dist.isend, val(rank, N, dt, 2), prev), dist.P2POp(dist.irecv, b, nxt)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            c.expect("batch_isend_irecv from prev " + dn, a, val(prev, N, dt, 1))
            c.expect("batch_isend_irecv from next " + dn, b, val(nxt, N, dt, 2))
            # Tags: two sends to nxt, received in the other order; then one from any rank,
            # whose sender is named.
            works = [dist.isend(val(rank, N, dt, 5), nxt, tag=5),
                     dist.isend(val(rank, N, dt, 6), nxt, tag=6)]
            g6, g5 = torch.zeros(N, dtype=dt), torch.zeros(N, dtype=dt)
            dist.recv(g6, prev, tag=6)
            dist.recv(g5, prev, tag=5)
            for w in works:
                w.wait()
            c.expect("recv by tag " + dn, torch.stack([g5, g6]),
                     torch.stack([val(prev, N, dt, 5), val(prev, N, dt, 6)]))
            w = dist.isend(val(rank, N, dt, 7), nxt, tag=7)
            g = torch.zeros(N, dtype=dt)
            source = dist.recv(g, tag=7)
            w.wait()
            c.expect("recv from any rank %s: sender" % dn, torch.tensor([source]),
                     torch.tensor([prev]))
            c.expect("recv from any rank " + dn, g, val(prev, N, dt, 7))
            # Receives posted before the sends that answer them, with an all-reduce between:
            # neither waits for the other (as with gloo).
            g, t = torch.zeros(BIG, dtype=dt), val(rank, N, dt)
            r = dist.irecv(g, prev, tag=8)
            dist.all_reduce(t)
            s = dist.isend(val(rank, BIG, dt, 8), nxt, tag=8)
            r.wait()
            s.wait()
            c.expect("irecv before isend " + dn, g, val(prev, BIG, dt, 8))
            c.expect("all_reduce behind an irecv " + dn, t, total(N, dt))
        c.run("send/recv " + dn, p2p)

    for dt in (torch.float32, torch.bfloat16):
        def big(dt=dt):
            t = val(rank, BIG, dt)
            dist.all_reduce(t)
            c.expect("all_reduce %d %s" % (BIG, name(dt)), t, total(BIG, dt))
            out = torch.zeros(world * BIG, dtype=dt)
            dist.all_gather_into_tensor(out, val(rank, BIG, dt, 1))
            c.expect("all_gather_into_tensor %d %s" % (BIG, name(dt)), out,
                     torch.cat(every(BIG, dt, 1)))
            out = torch.zeros(BIG, dtype=dt)
            dist.reduce_scatter_tensor(out, val(rank, world * BIG, dt))
            c.expect("reduce_scatter_tensor %d %s" % (BIG, name(dt)), out,
                     chunk(total(world * BIG, dt), rank, BIG))
        c.run("large " + name(dt), big)

    def functional():
        group = dist.group.WORLD
        for dt in (torch.float32, torch.bfloat16, torch.int64):
            t = funcol.all_reduce(val(rank, N, dt), "sum", group)
            c.expect("funcol.all_reduce " + name(dt), funcol.wait_tensor(t), total(N, dt))
            t = funcol.all_gather_tensor(val(rank, N, dt).view(2, -1), 0, group)
            c.expect("funcol.all_gather_tensor " + name(dt), funcol.wait_tensor(t),
                     torch.cat([v.view(2, -1) for v in every(N, dt)]))
            t = funcol.reduce_scatter_tensor(val(rank, 2 * world, dt), "sum", 0, group)
            c.expect("funcol.reduce_scatter_tensor " + name(dt), funcol.wait_tensor(t),
                     chunk(total(2 * world, dt), rank, 2))
        ops = torch.ops._c10d_functional
        t = ops.all_reduce(val(rank, N, torch.float32), "max", group.group_name)
        c.expect("_c10d_functional.all_reduce max", ops.wait_tensor(t),
                 stack(every(N, torch.float32)).max(0).values)
    c.run("functional collectives", functional)

    def channels_last():  # dense but not contiguous: conv weights and activations (NCCL takes them)
        def four_d(r):
            x = val(r, 24, torch.float32).view(2, 3, 2, 2)
            return x.contiguous(memory_format=torch.channels_last)
        t = four_d(rank)
        dist.all_reduce(t)
        c.expect("all_reduce channels_last", t, stack(four_d(r) for r in range(world)).sum(0))
        t = four_d(rank)
        dist.broadcast(t, src=world - 1)
        c.expect("broadcast channels_last", t, four_d(world - 1))
    c.run("channels_last", channels_last)

    def objects():  # pickles in uint8 tensors, sizes first (checkpointing, data loaders)
        mine = {"rank": rank, "name": "r%d" % rank}
        out = [None] * world
        dist.all_gather_object(out, mine)
        got = [None] * world if rank == 0 else None
        dist.gather_object(mine, got, dst=0)
        box = [("root", list(range(world)))] if rank == world - 1 else [None]
        dist.broadcast_object_list(box, src=world - 1)
        one = [None]
        parts = [("s%d" % j) * (j + 1) for j in range(world)]  # of unequal lengths
        dist.scatter_object_list(one, parts if rank == 0 else None, src=0)
        want = [{"rank": r, "name": "r%d" % r} for r in range(world)]
        ok = out == want and (rank != 0 or got == want) and box[0] == ("root", list(range(world))) \
            and one[0] == parts[rank]
        c.expect("object collectives", torch.tensor(ok), True)
    c.run("object collectives", objects)

    # Inputs and outputs that are views, not contiguous: the elements' logical order counts.
    def strided_all_gather():
        x = val(rank, 2 * N, torch.float32).view(2, N).t()  # N x 2, transposed
        out = torch.zeros(2, world * N).t()
        dist.all_gather_into_tensor(out, x)
        c.expect("all_gather_into_tensor strided", out,
                 torch.cat([val(r, 2 * N, torch.float32).view(2, N).t() for r in range(world)]))
    c.run("strided all_gather_into_tensor", strided_all_gather)

    def strided_reduce_scatter():
        def x(r):
            return val(r, 2 * world * N, torch.float32).view(2, world * N).t()
        out = torch.zeros(2, N).t()
        dist.reduce_scatter_tensor(out, x(rank))
        c.expect("reduce_scatter_tensor strided", out,
                 chunk(stack([x(r) for r in range(world)]).sum(0), rank, N))
    c.run("strided reduce_scatter_tensor", strided_reduce_scatter)

    def strided_all_to_all():
        def x(r):
            return val(r, 2 * world, torch.float32).view(2, world).t()
        out = torch.zeros(2, world).t()
        dist.all_to_all_single(out, x(rank))
        c.expect("all_to_all_single strided", out, torch.stack([x(r)[rank] for r in range(world)]))
    c.run("strided all_to_all_single", strided_all_to_all)

    def complex_sums():  # complex tensors reduce as their real and imaginary parts
        def z(r, n):
            return torch.complex(val(r, n, torch.float32), val(r, n, torch.float32, 5))
        out = torch.zeros(N, dtype=torch.complex64)
        dist.reduce_scatter_tensor(out, z(rank, world * N))
        c.expect("reduce_scatter_tensor complex64", torch.view_as_real(out),
                 torch.view_as_real(chunk(sum(z(r, world * N) for r in range(world)), rank, N)))
        t = z(rank, N).to(torch.complex128)
        dist.reduce(t, dst=0)
        if rank == 0:
            c.expect("reduce complex128", torch.view_as_real(t),
                     torch.view_as_real(sum(z(r, N) for r in range(world)).to(torch.complex128)))
    c.run("complex sums", complex_sums)

    def bitwise():  # BAND, BOR, BXOR on integer and bool tensors, every bit pattern
        def bits(r, n, dt):
            x = (torch.arange(n, dtype=torch.int64) * 37 + r * 101 + 13) % 251
            if dt == torch.bool:
                return x % 3 == 0
            width = torch.iinfo(dt).bits
            return (x * sum(1 << (8 * k) for k in range(width // 8))).to(dt)  # wraps: any bits

        fns = {"band": (dist.ReduceOp.BAND, torch.bitwise_and),
               "bor": (dist.ReduceOp.BOR, torch.bitwise_or),
               "bxor": (dist.ReduceOp.BXOR, torch.bitwise_xor)}
        for dt in INTS + (torch.bool,):
            for op, (red, fn) in fns.items():
                t = bits(rank, N, dt)
                dist.all_reduce(t, op=red)
                want = bits(0, N, dt)
                for r in range(1, world):
                    want = fn(want, bits(r, N, dt))
                c.expect("all_reduce %s %s" % (op, name(dt)), t, want)
        out = torch.zeros(N, dtype=torch.int32)
        dist.reduce_scatter_tensor(out, bits(rank, world * N, torch.int32), op=dist.ReduceOp.BXOR)
        want = bits(0, world * N, torch.int32)
        for r in range(1, world):
            want = want ^ bits(r, world * N, torch.int32)
        c.expect("reduce_scatter_tensor bxor int32", out, chunk(want, rank, N))
    c.run("bitwise", bitwise)

    def sparse():  # COO sums, asynchronous: a dense all-reduce issued after one, its future
        def sp(r):  # entries that overlap across ranks and some that do not; a dense dim of 3
            i = torch.tensor([[r % 3, 5, 7 + r]])
            v = torch.arange(9, dtype=torch.float32).view(3, 3) * (r + 1)
            return torch.sparse_coo_tensor(i, v, (16, 3))
        want = sum(sp(r).to_dense() for r in range(world))
        t = sp(rank)
        w = dist.all_reduce(t, async_op=True)
        fut = w.get_future()
        d = val(rank, N, torch.float32)
        dist.all_reduce(d)
        w.wait()
        c.expect("sparse all_reduce", t.to_dense(), want)
        got = fut.wait()
        got = got[0] if isinstance(got, list) else got
        c.expect("sparse all_reduce future", got.to_dense(), want)
        c.expect("dense all_reduce after a sparse one", d, total(N, torch.float32))
        t = sp(rank)
        dist.all_reduce(t)
        c.expect("sparse all_reduce, blocking", t.to_dense(), want)
        # The call returns before the peers have made theirs (they come 0.5 s later).
        t = sp(rank)
        if rank:
            time.sleep(0.5)
        t0 = time.monotonic()
        w = dist.all_reduce(t, async_op=True)
        issued = time.monotonic() - t0
        w.wait()
        if rank == 0:
            c.expect("sparse all_reduce returned in %.3f s, before its peers came" % issued,
                     torch.tensor(issued < 0.25), True)
        c.expect("sparse all_reduce, late peers", t.to_dense(), want)
    c.run("sparse", sparse)

    def dropped_works():  # an async call whose Work the caller drops at once: outputs still arrive
        outs = [torch.zeros(BIG, dtype=torch.float32) for _ in range(world)]
        dist.all_gather(outs, val(rank, BIG, torch.float32, 2), async_op=True)
        dist.barrier()  # ends after the all-gather
        c.expect("dropped all_gather", torch.cat(outs), torch.cat(every(BIG, torch.float32, 2)))
    c.run("dropped works", dropped_works)

    c.run("barrier", lambda: dist.barrier())
    if dist.get_backend() == "loom":
        c.run("all_reduce on loom.mem_alloc memory", lambda: mem_alloc(c, rank, world))
        c.run("dropped irecv and isend", lambda: dropped_p2p(c, rank, world))
        c.run("mixed layouts", lambda: mixed_layouts(c, rank, world))
        c.run("argument errors", lambda: argument_errors(c, rank, world))
        c.run("strided and aliased tensors", lambda: strided_and_aliased(c, rank, world))
        c.run("backend ended in a callback", lambda: ended_in_callback(c, rank, world))
    groups(c, rank, world)
    return {"checks": c.checks, "failures": c.failures, "errors": c.errors}


def mismatches():
    """Calls that differ across ranks, under TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's collective
    fingerprints, checked over a gloo side group before each call): what each raised, then a
    matching all-reduce's result."""
    rank, world = dist.get_rank(), dist.get_world_size()
    raised = {}

    def attempt(what, fn):
        try:
            fn()
            raised[what] = None
        except Exception as e:  # noqa: BLE001  the message is what is checked
            raised[what] = ("%s: %s" % (type(e).__name__, e))[:300]

    t = val(rank, N, torch.float32)
    attempt("all_reduce against broadcast",
            lambda: dist.all_reduce(t) if rank == 0 else dist.broadcast(t, 0))
    attempt("sizes", lambda: dist.all_reduce(val(rank, N + rank, torch.float32)))
    attempt("dtypes", lambda: dist.all_reduce(val(rank, N, torch.float32 if rank else torch.int32)))
    t = val(rank, N, torch.float32)
    dist.all_reduce(t)
    want = stack([val(r, N, torch.float32) for r in range(world)]).sum(0)
    return {"raised": raised, "after": bool(torch.equal(t.double(), want))}


def groups(c, rank, world):
    """new_group (the odd ranks, and the whole world again), new_subgroups_by_enumeration and
    split_group (which torch 2.13 refuses without an accelerator, whatever the backend)."""
    sub_ranks = list(range(1, world, 2))  # the odd ranks: [1, 3] of 4, [1] of 2

    def new_group():
        sub = dist.new_group(ranks=sub_ranks)
        again = dist.new_group(ranks=list(range(world)))
        if rank in sub_ranks:
            t = val(rank, N, torch.float32)
            dist.all_reduce(t, group=sub)
            c.expect("new_group all_reduce", t,
                     stack(val(r, N, torch.float32) for r in sub_ranks).sum(0))
            t = val(rank, N, torch.float32)
            dist.broadcast(t, group=sub, group_src=len(sub_ranks) - 1)
            c.expect("new_group broadcast", t, val(sub_ranks[-1], N, torch.float32))
            outs = [torch.zeros(N, dtype=torch.int64) for _ in sub_ranks]
            dist.all_gather(outs, val(rank, N, torch.int64), group=sub)
            c.expect("new_group all_gather", torch.stack(outs),
                     torch.stack([val(r, N, torch.int64) for r in sub_ranks]))
            c.expect("new_group rank", torch.tensor(dist.get_rank(sub)), sub_ranks.index(rank))
        t = val(rank, N, torch.float64)
        dist.all_reduce(t, group=again, op=dist.ReduceOp.MAX)
        c.expect("new_group world all_reduce max", t,
                 stack(val(r, N, torch.float64) for r in range(world)).max(0).values)
        dist.barrier(group=again)
    c.run("new_group", new_group)

    def by_enumeration():  # every rank in one of two groups at once: evens and odds
        halves = [list(range(0, world, 2)), list(range(1, world, 2))]
        mine, _ = dist.new_subgroups_by_enumeration(halves)
        group = halves[rank % 2]
        t = val(rank, N, torch.bfloat16)
        dist.all_reduce(t, group=mine)
        c.expect("new_subgroups_by_enumeration all_reduce", t,
                 stack(val(r, N, torch.bfloat16) for r in group).sum(0))
        out = torch.zeros(len(group) * N, dtype=torch.int32)
        dist.all_gather_into_tensor(out, val(rank, N, torch.int32), group=mine)
        c.expect("new_subgroups_by_enumeration all_gather", out,
                 torch.cat([val(r, N, torch.int32) for r in group]))
    c.run("new_subgroups_by_enumeration", by_enumeration)

    def split():
        halves = [list(range(0, world, 2)), list(range(1, world, 2))]
        pg = dist.split_group(split_ranks=halves)
        mine = halves[rank % 2]
        t = val(rank, N, torch.float32)
        dist.all_reduce(t, group=pg)
        c.expect("split_group all_reduce", t, stack(val(r, N, torch.float32) for r in mine).sum(0))
    c.run("split_group", split)
    dist.barrier()


def dropped_p2p(c, rank, world):
    """loom only (gloo ends the connection when a pending send's Work goes): an irecv and an
    isend of a temporary tensor, both handles dropped at once, still deliver."""
    got = torch.zeros(BIG, dtype=torch.float32)
    dist.irecv(got, src=(rank - 1) % world)
    dist.isend(val(rank, BIG, torch.float32, 3), dst=(rank + 1) % world)
    want = val((rank - 1) % world, BIG, torch.float32, 3)
    deadline = time.monotonic() + 20
    while not torch.equal(got, want) and time.monotonic() < deadline:
        time.sleep(0.01)
    c.expect("dropped irecv and isend", got, want)
    dist.barrier()


def mixed_layouts(c, rank, world):
    """loom only (gloo takes contiguous tensors alone): a send of a transposed view to a
    contiguous receive, and the reverse, deliver the elements in logical order."""
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    m = val(rank, 12, torch.float32).view(3, 4)
    got = torch.zeros(4, 3)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, m.t(), nxt),
                                   dist.P2POp(dist.irecv, got, prev)])
    for q in reqs:
        q.wait()
    c.expect("send transposed, receive contiguous", got, val(prev, 12, torch.float32).view(3, 4).t())
    into = torch.zeros(3, 4)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, m.t().contiguous(), nxt),
                                   dist.P2POp(dist.irecv, into.t(), prev)])
    for q in reqs:
        q.wait()
    c.expect("send contiguous, receive transposed", into.t(),
             val(prev, 12, torch.float32).view(3, 4).t())


def argument_errors(c, rank, world):
    """loom only: calls that every rank gets wrong alike are refused at once, the argument
    named, and the group still works after them."""
    def refused(what, fn, text):
        try:
            fn()
        except Exception as e:  # noqa: BLE001  the message is what is checked
            c.expect("%s refused naming %r (%s)" % (what, text, e), torch.tensor(text in str(e)),
                     True)
            return
        c.expect(what + " refused", torch.tensor(False), True)

    splits = [world] + [-1] * (world - 1)  # summing to the tensors' one row
    refused("all_to_all_single with a negative split",
            lambda: dist.all_to_all_single(torch.zeros(1), torch.zeros(1), splits, splits),
            "split_sizes[1]")
    refused("max of complex64",
            lambda: dist.reduce_scatter_tensor(torch.zeros(1, dtype=torch.complex64),
                                               torch.ones(world, dtype=torch.complex64),
                                               op=dist.ReduceOp.MAX), "complex tensors reduce by")
    premul = dist._make_nccl_premul_sum(2.0)
    refused("premul_sum of int64", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64),
                                                           op=premul), "PREMUL_SUM")
    refused("band of float32", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND),
            "BAND of Float")
    # Inside a block (the backend's own coalescing, as with a device given): a sparse all-reduce
    # runs apart from the block's calls, so the block's Work could not cover it. (torch's
    # all_reduce defers to the block's end; the group's own call reaches the backend at once.)
    d = val(rank, N, torch.float32)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        refused("sparse all_reduce in a coalescing block",
                lambda: dist.group.WORLD.allreduce([torch.ones(4).to_sparse()]),
                "inside a coalescing block")
        dist.all_reduce(d)
    cm.wait()
    c.expect("the block's all_reduce beside the refused sparse one", d,
             stack([val(r, N, torch.float32) for r in range(world)]).sum(0))
    t = val(rank, N, torch.float32)
    dist.all_reduce(t)
    c.expect("all_reduce after refused calls", t,
             stack([val(r, N, torch.float32) for r in range(world)]).sum(0))


def strided_and_aliased(c, rank, world):
    """loom only (gloo refuses some of these, or gets them wrong): in-place collectives on a
    column of a matrix (a strided view, through a contiguous copy), outputs into columns,
    all_to_all_single in place without splits, a PREMUL_SUM with a NaN factor and then finite
    ones (each its own factor), and a sparse all-reduce whose sizes differ across ranks (refused
    on every rank, the group usable after)."""
    n = 3 * world
    allsum = stack([val(r, n, torch.float32) for r in range(world)]).sum(0)
    m = torch.zeros(n, 2)
    m[:, 1] = val(rank, n, torch.float32)
    dist.all_reduce(m[:, 1])
    c.expect("all_reduce of a column", m, torch.stack([torch.zeros(n), allsum], 1))
    m = torch.zeros(n, 2)
    m[:, 0] = val(rank, n, torch.float32)
    dist.broadcast(m[:, 0], src=world - 1)
    c.expect("broadcast of a column", m[:, 0], val(world - 1, n, torch.float32))
    m[:, 0] = val(rank, n, torch.float32)
    dist.reduce(m[:, 0], dst=0)
    if rank == 0:
        c.expect("reduce of a column", m[:, 0], allsum)
    out = torch.zeros(n, 2)
    dist.all_gather_into_tensor(out[:, 1], val(rank, 3, torch.float32))
    c.expect("all_gather_into_tensor into a column", out[:, 1],
             torch.cat([val(r, 3, torch.float32) for r in range(world)]))
    out = torch.zeros(3, 2)
    dist.reduce_scatter_tensor(out[:, 0], val(rank, n, torch.float32))
    c.expect("reduce_scatter_tensor into a column", out[:, 0], chunk(allsum, rank, 3))
    t = val(rank, 2 * world, torch.float32)
    dist.all_to_all_single(t, t)
    c.expect("all_to_all_single in place", t,
             torch.cat([chunk(val(r, 2 * world, torch.float32), rank, 2) for r in range(world)]))
    t = val(rank, 2 * world, torch.float32)
    dist.all_to_all_single(t, t, [2] * world, [2] * world)
    c.expect("all_to_all_single in place with splits", t,
             torch.cat([chunk(val(r, 2 * world, torch.float32), rank, 2) for r in range(world)]))
    got = []
    for f in (float("nan"), 2.0, 0.5):
        t = torch.ones(4)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
        got.append(t)
    c.expect("premul_sum by NaN", torch.isnan(got[0]), torch.ones(4, dtype=torch.bool))
    c.expect("premul_sum by 2 after NaN", got[1], torch.full((4,), 2.0 * world))
    c.expect("premul_sum by 0.5 after NaN", got[2], torch.full((4,), 0.5 * world))
    rows = 8 + rank  # sizes that differ across ranks
    try:
        dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[rows - 1]]), torch.ones(1, 2),
                                                (rows, 2)))
        c.expect("sparse all_reduce of different sizes refused", torch.tensor(False), True)
    except Exception as e:  # noqa: BLE001  the message is what is checked
        c.expect("sparse sizes that differ refused (%s)" % e, torch.tensor("differs" in str(e)),
                 True)
    s = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.ones(1, 2), (world, 2))
    dist.all_reduce(s)
    c.expect("sparse all_reduce after the refused one", s.to_dense(), torch.ones(world, 2))


def ended_in_callback(c, rank, world):
    """loom only: a future's callback that drops the last reference to its backend ends the
    backend on the thread that completes the future (the completion thread; the sparse lane),
    which must then not join itself. The process goes on, and exits cleanly after."""
    import datetime
    import threading
    import loom.torch
    store = dist.distributed_c10d._get_default_store()
    for i, sparse in enumerate((False, True)):
        be = loom.torch._ext.create_backend(dist.PrefixStore("ended%d" % i, store), rank, world,
                                            datetime.timedelta(seconds=30))
        t = torch.ones(8)
        if sparse:
            t = t.to_sparse()
        if rank:
            time.sleep(0.3)  # so that rank 0's callback runs when the operation ends, not at once
        fut = be.allreduce([t]).get_future()
        box = [be]
        del be
        threads = []

        def drop(f):
            threads.append(threading.current_thread() is threading.main_thread())
            box.clear()  # the backend's last reference
            return f.value()

        got = fut.then(drop).wait()[0]
        what = "sparse" if sparse else "dense"
        c.expect("%s all_reduce whose callback ended its backend" % what,
                 got.to_dense() if sparse else got, torch.full((8,), float(world)))
        if rank == 0:
            c.expect("%s: the callback ran off the main thread" % what, torch.tensor(threads),
                     torch.tensor([False]))
    # The threads those callbacks stopped have ended; the next backend made joins them.
    time.sleep(0.2)
    be = loom.torch._ext.create_backend(dist.PrefixStore("ended_next", store), rank, world,
                                        datetime.timedelta(seconds=30))
    c.expect("threads stopped in callbacks, left unjoined once a backend was made",
             torch.tensor(loom.torch._ext.stopped_threads()), torch.tensor(0))
    del be


def mem_alloc(c, rank, world):
    """loom only: an all-reduce whose tensor lies in loom.mem_alloc memory (torch.frombuffer,
    no copy), large enough for the direct all-reduce to read it in place."""
    import loom
    count = 1 << 16
    shared = torch.frombuffer(loom.mem_alloc(count, "float32"), dtype=torch.float32)
    pattern = torch.arange(count, dtype=torch.float32) % 7
    shared.copy_(pattern + rank)
    dist.all_reduce(shared)
    c.expect("all_reduce on loom.mem_alloc memory", shared, pattern * world + sum(range(world)))
