"""The Python package over real processes: every collective on 2 and 3 ranks,
checked against a reference computed here in plain Python from every rank's
inputs; bad arguments raise LoomError naming the argument."""

import array
import json
import os
import pickle
import random
import socket
import subprocess
import sys
import tempfile
import unittest

import loom
from loom.errors import INVALID_ARGUMENT, INVALID_USAGE
from ranks import run_ranks, run_process

try:
    import numpy
except ImportError:
    numpy = None

SIGNED = "bilqfd"
RANKS = (2, 3)
OPS = ("sum", "prod", "max", "min", "avg")
BITWISE = ("band", "bor", "bxor")  # integer types only


def ops_of(typecode):
    return OPS + (BITWISE if typecode in "bBiIqQ" else ())


def value(rank, i, typecode):
    """Rank rank's element i: small integers, exact in every type."""
    v = (rank * 5 + i * 3 + 1) % 7
    return v - 3 if typecode in SIGNED else v


def inputs(rank, count, typecode):
    return array.array(typecode, [value(rank, i, typecode) for i in range(count)])


def reduce_ref(op, values, floating, scale=1):
    """op over one element's values from every rank (C division for integer avg)."""
    vals = [v * scale for v in values]
    if op == "prod":
        acc = 1
        for v in vals:
            acc *= v
        return acc
    if op == "max":
        return max(vals)
    if op == "min":
        return min(vals)
    if op in BITWISE:  # Python's ints act as two's complement of any width
        acc = vals[0]
        for v in vals[1:]:
            acc = acc & v if op == "band" else acc | v if op == "bor" else acc ^ v
        return acc
    total = sum(vals)
    if op == "avg":
        return total / len(vals) if floating else int(total / len(vals))
    return total


def close(got, want):
    return all(abs(g - w) <= 1e-5 * (1 + abs(w)) for g, w in zip(got, want)) and len(got) == len(want)


# ---- Rank bodies (run in the forked ranks) ----

def body_all_reduce(comm, rank, n, count):
    out = {}
    for tc in "bBiIqQfd":
        for k, op in enumerate(ops_of(tc)):
            send = inputs(rank, count, tc)
            if k % 2:  # in place
                comm.all_reduce(send, op=op)
                out[tc, op] = list(send)
            else:
                recv = array.array(tc, [0] * count)
                comm.all_reduce(send, recv, op=op)
                out[tc, op] = list(recv)
    return out


def body_rooted(comm, rank, n, count):
    out = {}
    for root in range(n):
        buf = inputs(rank, count, "i")
        comm.broadcast(buf, root=root)
        out["bcast", root] = list(buf)
        recv = array.array("d", [0.0] * count)
        comm.reduce(inputs(rank, count, "d"), recv, op="max", root=root)
        out["reduce", root] = list(recv)
    return out


def body_gather_family(comm, rank, n, count):
    send = inputs(rank, count, "q")
    gathered = array.array("q", [0] * (count * n))
    comm.all_gather(send, gathered)
    rs_in = inputs(rank, count * n, "f")
    rs_out = array.array("f", [0.0] * count)
    comm.reduce_scatter(rs_in, rs_out, op="sum")
    a2a_in = array.array("i", [rank * 1000 + j for j in range(count * n)])
    a2a_out = array.array("i", [0] * (count * n))
    comm.all_to_all(a2a_in, a2a_out)
    # The same, in place: the input as this rank's block of the output (all_gather, gather at
    # the last rank), the output as this rank's block of the input (reduce_scatter, scatter
    # from the last rank).
    root = n - 1
    ag = array.array("q", [0] * (count * n))
    ag[rank * count:(rank + 1) * count] = send
    mv = memoryview(ag)
    comm.all_gather(mv[rank * count:(rank + 1) * count], mv)
    rs = inputs(rank, count * n, "f")
    rmv = memoryview(rs)
    comm.reduce_scatter(rmv, rmv[rank * count:(rank + 1) * count], op="sum")
    g = array.array("q", [0] * (count * n))
    g[rank * count:(rank + 1) * count] = send
    gmv = memoryview(g)
    comm.gather(gmv[rank * count:(rank + 1) * count], gmv if rank == root else None, root=root)
    sc = array.array("q", [j * 10 + 1 for j in range(count * n)] if rank == root else [0] * (count * n))
    smv = memoryview(sc)
    comm.scatter(smv if rank == root else None, smv[rank * count:(rank + 1) * count], root=root)
    in_place = (list(ag), list(rs[rank * count:(rank + 1) * count]),
                list(g) if rank == root else None, list(sc[rank * count:(rank + 1) * count]))
    return list(gathered), list(rs_out), list(a2a_out), in_place


def vcount(src, dst):
    """Elements rank src sends rank dst in the unequal all-to-all (0 for some pairs)."""
    return (3 * src + 5 * dst) % 7


def body_variable(comm, rank, n):
    # Unequal all-to-all, the blocks end to end, then with gaps between the received blocks
    # (displacements); the gaps keep their sentinel.
    send_counts = [vcount(rank, j) for j in range(n)]
    recv_counts = [vcount(j, rank) for j in range(n)]
    send = array.array("q", [rank * 1000 + j * 100 + k for j in range(n) for k in range(send_counts[j])])
    recv = array.array("q", [-1] * sum(recv_counts))
    comm.all_to_all_v(send, send_counts, recv, recv_counts)
    displs = [sum(recv_counts[:j]) + 2 * j for j in range(n)]
    spaced = array.array("q", [-1] * (sum(recv_counts) + 2 * n))
    comm.all_to_all_v(send, tuple(send_counts), spaced, recv_counts, recv_displs=displs)
    # Blocks of up to 420 KiB, past the transports' slots.
    big_send = array.array("q", [rank * 10**7 + j * 10**6 + k for j in range(n)
                                 for k in range(send_counts[j] * 9000)])
    big_recv = array.array("q", [-1] * (sum(recv_counts) * 9000))
    comm.all_to_all_v(big_send, [c * 9000 for c in send_counts], big_recv,
                      [c * 9000 for c in recv_counts])
    big_want = [j * 10**7 + rank * 10**6 + k for j in range(n) for k in range(recv_counts[j] * 9000)]
    # Gather and scatter from every root.
    gathered, scattered = [], []
    for root in range(n):
        out = array.array("d", [0.0] * (5 * n)) if rank == root else None
        comm.gather(array.array("d", [rank * 10.0 + k + root for k in range(5)]), out, root=root)
        gathered.append(list(out) if out is not None else None)
        src = array.array("i", [j * 10 + k + root for j in range(n) for k in range(3)]) \
            if rank == root else None
        mine = array.array("i", [0] * 3)
        comm.scatter(src, mine, root=root)
        scattered.append(list(mine))
    return list(recv), list(spaced), gathered, scattered, list(big_recv) == big_want


def body_send_recv(comm, rank, n, count):
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    got = bytearray(count)
    with loom.group():
        comm.send(bytes(inputs(rank, count, "B")), nxt)
        comm.recv(got, prev)
    comm.barrier()
    return list(got)


def body_tagged(comm, rank, n, count):
    # Every other rank sends this rank two tags, the later one first; this rank takes tag 1 from
    # any rank, then tag 2 from each rank in turn: [(sender, values)] in receive order.
    for dst in range(n):
        if dst != rank:
            for tag in (2, 1):
                comm.send(array.array("i", [rank * 100 + tag] * count), dst, tag=tag)
    got = []
    for tag, peers in ((1, [None] * (n - 1)), (2, [p for p in range(n) if p != rank])):
        for peer in peers:
            buf = array.array("i", [-1] * count)
            source = comm.recv(buf, peer, tag=tag)
            got.append((tag, source, sorted(set(buf))))
    comm.barrier()
    return got


def body_tags(comm, rank, n, path):
    # The tagged all-reduce and the untagged one after it, read back from this rank's dump.
    x = array.array("f", [1.0])
    comm.set_op_tag(41)
    comm.all_reduce(x)
    comm.all_reduce(x)
    comm.dump_trace(path % rank)
    with open(path % rank) as f:
        ops = json.load(f)["ops"]
    return [x[0], [o.get("tag") for o in ops[-2:]]]


def body_buffers(comm, rank, n):
    # bytearray (uint8) in place; memoryview over array.array; dtype= over raw bytes.
    b = bytearray([rank + 1] * 5)
    comm.all_reduce(b)
    mv_in = memoryview(array.array("d", [rank + 0.5] * 4))
    mv_out = memoryview(array.array("d", [0.0] * 4))
    comm.all_reduce(mv_in, mv_out, op="max")
    raw = bytearray(array.array("i", [rank + 1] * 3).tobytes())
    comm.all_reduce(raw, dtype="int32", op=loom.ReduceOp.PROD)
    return list(b), list(mv_out), list(array.array("i", bytes(raw)))


def body_split_premul(comm, rank, n):
    sub = comm.split(rank % 2, key=-rank)
    info = (sub.rank, sub.size)
    x = array.array("i", [rank])
    sub.all_reduce(x)
    sub.destroy()
    op = comm.premul_sum(2.5, "float64")
    y = array.array("d", [rank + 1.0, 1.0])
    comm.all_reduce(y, op=op)
    op.destroy()
    return info, x[0], list(y)


def body_with_raises(comm, rank, n):
    # Rank 0 leaves `with comm:` on an exception while rank 1 waits in an all-reduce: the exit
    # aborts, and rank 1 fails at once (a destroy would finalize, and rank 1 would wait out its
    # timeout, as it did).
    import time
    if rank == 0:
        try:
            with comm:
                raise ValueError("a bug of the caller's")
        except ValueError:
            time.sleep(5)  # alive: rank 1 must learn of the abort, not of this process's end
            return "left"
    t0 = time.monotonic()
    try:
        comm.all_reduce(array.array("f", [1.0]))
        return "completed"
    except loom.LoomError as e:
        comm.abort()  # the communicator failed: nothing to finalize
        return e.code, time.monotonic() - t0


def body_numpy(comm, rank, n):
    a = numpy.arange(12, dtype=numpy.float32).reshape(3, 4) * (rank + 1)
    comm.all_reduce(a)
    g = numpy.zeros((n, 5), dtype=numpy.int64)
    comm.all_gather(numpy.full(5, rank, dtype=numpy.int64), g)
    # An array over loom.mem_alloc memory (no copy: the same shared-memory object).
    m = numpy.frombuffer(loom.mem_alloc(6, "float64"), dtype=numpy.float64)
    m[:] = rank + 1.5
    comm.all_reduce(m)
    return a.tolist(), g.tolist(), (m.tolist(), backing_file(memoryview(m)))


def backing_file(view):
    """The file /proc/self/maps gives for the mapping that holds view's first byte."""
    import ctypes
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


def body_mem_alloc(comm, rank, n, count):
    # Inputs in loomMemAlloc memory (read in place by the peers where the all-reduce takes
    # slices; `count` spans several of its rounds), out of place into another such buffer and in
    # place; rank 0 also passes plain memory once, mixed with the others' shared inputs.
    import gc
    out = {}
    files = []
    for tc, dt in (("f", "float32"), ("q", "int64")):
        send = loom.mem_alloc(count, dt)
        recv = loom.mem_alloc(count, dt)
        files += [backing_file(send), backing_file(recv)]
        out["format", tc] = (send.format, send.shape, send.readonly, set(send[:8]))
        send[:] = inputs(rank, count, tc)
        comm.all_reduce(send, recv)
        out["out", tc] = list(recv)
        comm.all_reduce(send, op="max")  # in place
        out["in", tc] = list(send)
        plain = inputs(rank, count, tc)
        mixed = plain if rank == 0 else send
        mixed[:] = inputs(rank, count, tc)
        comm.all_reduce(mixed, recv, op="min")
        out["mixed", tc] = list(recv)
    # bfloat16 (a format of 16-bit integers, so dtype= names it): rank + 1 summed, exact.
    bf = loom.mem_alloc(3, "bfloat16")
    one = 0x3F80  # 1.0's top 16 bits
    bf[:] = array.array("H", [one] * 3)
    comm.all_reduce(bf, dtype="bfloat16")
    out["bf16"] = [array.array("f", (b << 16).to_bytes(4, sys.byteorder))[0] for b in bf]
    files.append(backing_file(bf))
    out["files"] = files
    # Freed once the last view goes: the shared-memory objects are gone from /dev/shm.
    del send, recv, mixed, bf
    gc.collect()
    out["left"] = [f for f in files if os.path.exists(f)]
    return out


class Collectives(unittest.TestCase):
    def test_all_reduce_every_type_and_op(self):
        count = 37
        for n in RANKS:
            results = run_ranks(n, body_all_reduce, count)
            for tc in "bBiIqQfd":
                for op in ops_of(tc):
                    want = [reduce_ref(op, [value(r, i, tc) for r in range(n)], tc in "fd")
                            for i in range(count)]
                    for rank in range(n):
                        got = results[rank][tc, op]
                        self.assertTrue(close(got, want),
                                        "n=%d type %s op %s rank %d: %s != %s"
                                        % (n, tc, op, rank, got[:8], want[:8]))

    def test_broadcast_and_reduce_every_root(self):
        count = 19
        for n in RANKS:
            results = run_ranks(n, body_rooted, count)
            for root in range(n):
                for rank in range(n):
                    self.assertEqual(results[rank]["bcast", root],
                                     [value(root, i, "i") for i in range(count)])
                want = [max(value(r, i, "d") for r in range(n)) for i in range(count)]
                self.assertEqual(results[root]["reduce", root], want)

    def test_all_gather_reduce_scatter_all_to_all(self):
        count = 11
        for n in RANKS:
            results = run_ranks(n, body_gather_family, count)
            want_gathered = [value(r, i, "q") for r in range(n) for i in range(count)]
            for rank, (gathered, rs, a2a, in_place) in enumerate(results):
                self.assertEqual(gathered, want_gathered)
                want_rs = [sum(value(r, rank * count + i, "f") for r in range(n)) for i in range(count)]
                self.assertTrue(close(rs, want_rs), "%s != %s" % (rs, want_rs))
                self.assertEqual(a2a, [src * 1000 + rank * count + i
                                       for src in range(n) for i in range(count)])
                ag, rs_in_place, g, sc = in_place
                self.assertEqual(ag, want_gathered)
                self.assertTrue(close(rs_in_place, want_rs), "%s != %s" % (rs_in_place, want_rs))
                self.assertEqual(g, want_gathered if rank == n - 1 else None)
                self.assertEqual(sc, [(rank * count + i) * 10 + 1 for i in range(count)])

    def test_all_to_all_v_gather_scatter(self):
        for n in RANKS:
            for rank, (recv, spaced, gathered, scattered, big_ok) in enumerate(
                    run_ranks(n, body_variable)):
                self.assertTrue(big_ok, "rank %d of %d: large blocks" % (rank, n))
                blocks = [[j * 1000 + rank * 100 + k for k in range(vcount(j, rank))] for j in range(n)]
                self.assertEqual(recv, [x for b in blocks for x in b])
                self.assertEqual(spaced, [x for b in blocks for x in b + [-1, -1]])
                for root in range(n):
                    if rank == root:
                        self.assertEqual(gathered[root], [r * 10.0 + k + root for r in range(n)
                                                          for k in range(5)])
                    else:
                        self.assertIsNone(gathered[root])
                    self.assertEqual(scattered[root], [rank * 10 + k + root for k in range(3)])

    def test_send_recv_ring_and_barrier(self):
        count = 4099
        for n in RANKS:
            results = run_ranks(n, body_send_recv, count)
            for rank in range(n):
                self.assertEqual(results[rank], [value((rank - 1) % n, i, "B") for i in range(count)])

    def test_tagged_messages_and_any_source(self):
        count = 3000
        for n in RANKS:
            results = run_ranks(n, body_tagged, count)
            for rank in range(n):
                others = [p for p in range(n) if p != rank]
                firsts = results[rank][:n - 1]
                self.assertEqual(sorted(s for _, s, _ in firsts), others)
                for tag, source, values in firsts:
                    self.assertEqual((tag, values), (1, [source * 100 + 1]))
                self.assertEqual(results[rank][n - 1:], [(2, p, [p * 100 + 2]) for p in others])

    def test_op_tags_reach_the_trace(self):
        with tempfile.TemporaryDirectory(prefix="loom_py_tags_") as d:
            results = run_ranks(2, body_tags, os.path.join(d, "rank%d.json"))
        self.assertEqual(results, [[4.0, [41, None]]] * 2)

    def test_bytearray_memoryview_and_explicit_dtype(self):
        n = 2
        results = run_ranks(n, body_buffers)
        for b, mx, prod in results:
            self.assertEqual(b, [3] * 5)
            self.assertEqual(mx, [1.5] * 4)
            self.assertEqual(prod, [2] * 3)

    def test_split_and_premul_sum(self):
        n = 3
        results = run_ranks(n, body_split_premul)
        for rank, (info, x, y) in enumerate(results):
            members = [r for r in range(n) if r % 2 == rank % 2]
            # key = -rank: the highest old rank comes first.
            self.assertEqual(info, (sorted(members, reverse=True).index(rank), len(members)))
            self.assertEqual(x, sum(members))
            self.assertTrue(close(y, [2.5 * sum(r + 1.0 for r in range(n)), 2.5 * n]), y)

    def test_leaving_with_on_an_exception_aborts(self):
        left, (code, seconds) = run_ranks(2, body_with_raises)
        self.assertEqual(left, "left")
        self.assertEqual(code, loom.errors.REMOTE_ERROR)
        self.assertLess(seconds, 2)  # rank 0 lives 5 s more; the harness's timeout is far longer

    def test_mem_alloc_buffers(self):
        count = 150001  # 600 KB of float32: the direct all-reduce's slices, in rounds
        for n in RANKS:
            results = run_ranks(n, body_mem_alloc, count)
            for tc in "fq":
                for op, key in (("sum", "out"), ("max", "in"), ("min", "mixed")):
                    want = [reduce_ref(op, [value(r, i, tc) for r in range(n)], tc == "f")
                            for i in range(count)]
                    for rank in range(n):
                        got = results[rank][key, tc]
                        self.assertTrue(close(got, want), "n=%d %s %s rank %d: %s != %s"
                                        % (n, tc, key, rank, got[:8], want[:8]))
            for rank in range(n):
                fmt, shape, readonly, zeros = results[rank]["format", "f"]
                self.assertEqual((fmt, shape, readonly), ("f", (count,), False))
                self.assertEqual(zeros, {0.0})
                self.assertEqual(results[rank]["format", "q"][:2], ("q", (count,)))
                files = results[rank]["files"]
                self.assertEqual(len(set(files)), 5, files)
                for f in files:
                    self.assertRegex(f, r"^/dev/shm/loom-mem-", "rank %d: %s" % (rank, files))
                self.assertEqual(results[rank]["left"], [], "rank %d: freed buffers left" % rank)
                self.assertEqual(results[rank]["bf16"], [float(n)] * 3)

    @unittest.skipIf(numpy is None, "numpy not installed (scripts/setup.sh installs python3-numpy)")
    def test_numpy_arrays(self):
        n = 2
        results = run_ranks(n, body_numpy)
        want = [[float(v * 3) for v in range(r * 4, r * 4 + 4)] for r in range(3)]
        for a, g, (m, f) in results:
            self.assertEqual(a, want)
            self.assertEqual(g, [[r] * 5 for r in range(n)])
            self.assertEqual(m, [sum(r + 1.5 for r in range(n))] * 6)
            self.assertRegex(f, r"^/dev/shm/loom-mem-")


def free_port():
    # Below the kernel's ephemeral range (as loom::net::freeLoopbackPort): no socket that
    # connects or listens on port 0 can take it before rank 0 binds it.
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(256):
        port = random.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free loopback port")


def env_rank(rank, n, port):
    os.environ.update(LOOM_RANK=str(rank), LOOM_WORLD_SIZE=str(n),
                      LOOM_COMM_ID="127.0.0.1:%d" % port)
    with loom.Communicator.from_env(timeout_ms=60000) as comm:
        x = array.array("q", [rank + 1])
        comm.all_reduce(x)
        return comm.rank, comm.size, x[0]


class FromEnv(unittest.TestCase):
    def test_from_env(self):
        import multiprocessing
        n, port = 3, free_port()
        with multiprocessing.get_context("fork").Pool(n) as pool:
            res = pool.starmap_async(env_rank, [(r, n, port) for r in range(n)]).get(120)
        self.assertEqual(res, [(r, n, 6) for r in range(n)])


# ---- Errors, each on a one-rank communicator in a forked process ----

def error_cases():
    uid = loom.unique_id()
    comm = loom.Communicator(0, 1, uid)
    f = array.array("f", [1.0, 2.0])
    cases = {
        "op": lambda: comm.all_reduce(f, op="median"),
        "op int": lambda: comm.all_reduce(f, op=5),  # not a ReduceOp's value (a PreMulSum's)
        "band float": lambda: comm.all_reduce(f, op="band"),
        "readonly": lambda: comm.all_reduce(f, b"12345678"),
        "size": lambda: comm.all_reduce(f, array.array("f", [0.0] * 3)),
        "dtype mismatch": lambda: comm.all_reduce(f, array.array("i", [0, 0])),
        "format": lambda: comm.all_reduce(array.array("h", [1, 2])),
        "contiguous": lambda: comm.all_reduce(memoryview(array.array("f", [0.0] * 4))[::2]),
        "root": lambda: comm.broadcast(f, root=5),
        "peer": lambda: comm.send(f, 3),
        "tag": lambda: comm.send(f, 0, tag=2**31),
        "dtype name": lambda: comm.all_reduce(f, dtype="complex64"),
        "not a buffer": lambda: comm.all_reduce([1.0, 2.0]),
        "gather size": lambda: comm.all_gather(f, array.array("f", [0.0])),
        "uid": lambda: loom.Communicator(0, 2, b"short"),
        "rank": lambda: loom.Communicator(5, 2, uid),
        "timeout": lambda: loom.Communicator(0, 1, uid, timeout_ms=-1),
        "mem count": lambda: loom.mem_alloc(0),
        "mem count type": lambda: loom.mem_alloc(2.5),
        "mem count huge": lambda: loom.mem_alloc(1 << 62, "float64"),
        "mem dtype": lambda: loom.mem_alloc(4, "complex64"),
        "mem bfloat16": lambda: comm.all_reduce(loom.mem_alloc(4, "bfloat16")),
        "a2av counts length": lambda: comm.all_to_all_v(f, [1, 1], f, [2]),
        "a2av negative": lambda: comm.all_to_all_v(f, [-1], f, [2]),
        "a2av counts type": lambda: comm.all_to_all_v(f, 2, f, [2]),
        "a2av past end": lambda: comm.all_to_all_v(f, [3], f, [2]),
        "a2av displs": lambda: comm.all_to_all_v(f, [2], f, [2], recv_displs=[1]),
        "a2av self": lambda: comm.all_to_all_v(f, [1], array.array("f", [0.0, 0.0]), [2]),
        "rooted gather size": lambda: comm.gather(f, array.array("f", [0.0] * 3)),
        "gather root": lambda: comm.gather(f, f, root=1),
        "scatter size": lambda: comm.scatter(array.array("f", [0.0] * 3), f),
        "scatter none": lambda: comm.scatter(None, f),
        "tag negative": lambda: comm.set_op_tag(-1),
        "tag type": lambda: comm.set_op_tag("7"),
        # Ints that C's int cannot hold are refused, not wrapped (2**32 used to be rank 0).
        "root wraps": lambda: comm.broadcast(f, root=2**32),
        "peer wraps": lambda: comm.send(f, 2**32 + 1),
        "rank wraps": lambda: loom.Communicator(2**32, 1, uid),
        "world wraps": lambda: loom.Communicator(0, 2**32 + 1, uid),
        "timeout wraps": lambda: loom.Communicator(0, 1, uid, timeout_ms=2**32 + 1),
        "timeout bool": lambda: loom.Communicator(0, 1, uid, timeout_ms=True),
        "key type": lambda: comm.split(0, key="a"),
        "name type": lambda: loom.Communicator(0, 1, uid, name=5),
        "premul range": lambda: comm.premul_sum(1000, "int8"),
        "premul type": lambda: comm.premul_sum("abc", "float32"),
        "trace path type": lambda: comm.dump_trace(123),
        "pointer negative": lambda: comm.all_reduce(loom.Pointer(-4096, 4, "float32")),
    }
    mem = memoryview(array.array("f", [1.0, 2.0, 3.0, 4.0]))
    gone = comm.premul_sum(0.5, "float32")
    gone.destroy()
    reuse = comm.premul_sum(3.0, "float32")  # takes the destroyed op's number
    child = comm.split(0)
    foreign = child.premul_sum(2.0, "float32")  # the same number again, on the child
    assert reuse.value == gone.value == foreign.value, (reuse.value, gone.value, foreign.value)
    cases.update({
        "premul destroyed": lambda: comm.all_reduce(f, op=gone),
        "premul foreign": lambda: comm.all_reduce(f, op=foreign),
        "overlap": lambda: comm.all_reduce(mem[0:2], mem[1:3]),
        "overlap a2a": lambda: comm.all_to_all(f, f),
        "overlap gather": lambda: comm.all_gather(mem[1:3], mem[0:2]),
        "recv untagged any": lambda: comm.recv(f),
        "premul huge": lambda: comm.premul_sum(10**400, "float64"),
        "premul float32 range": lambda: comm.premul_sum(1e300, "float32"),
        "pointer float count": lambda: loom.Pointer(16, 4.9, "int8"),
        "pointer count wraps": lambda: loom.Pointer(16, 2**64 + 4, "int8"),
        "pointer none": lambda: loom.Pointer(None, 4, "int8"),
        "pointer too big": lambda: loom.Pointer(16, 2**62, "float32"),
        "mem count bool": lambda: loom.mem_alloc(True),
    })
    # Accepted: NumPy's integers and types where ints and types are asked for, and the
    # in-place layouts (one buffer; all_gather's input as its block of the output).
    if numpy is not None:
        x = numpy.ones(2, numpy.float32)
        cases.update({
            "ok numpy root": lambda: comm.broadcast(x, root=numpy.int64(0)),
            "ok numpy dtype": lambda: comm.all_reduce(x, dtype=numpy.float32),
            "ok numpy dtype object": lambda: comm.all_reduce(x, dtype=numpy.dtype("float32")),
            "ok numpy key": lambda: comm.split(numpy.int32(0), key=numpy.int64(0)).destroy(),
            "big-endian dtype": lambda: comm.all_reduce(x, dtype=numpy.dtype(">f4")),
            "ok numpy counts": lambda: comm.all_to_all_v(x, numpy.array([2]), numpy.zeros(2, numpy.float32),
                                                         numpy.array([2])),
        })
    cases["ok all_gather in place"] = lambda: comm.all_gather(mem, mem)
    cases["ok premul own"] = lambda: child.all_reduce(array.array("f", [1.0]), op=foreign)
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = None
        except loom.LoomError as e:
            out[name] = (e.code, e.message)
    out["pickled"] = pickle.loads(pickle.dumps(loom.LoomError(INVALID_ARGUMENT, "x: y"))).message
    child.destroy()
    comm.destroy()
    try:
        comm.barrier()
        out["destroyed"] = None
    except loom.LoomError as e:
        out["destroyed"] = (e.code, e.message)
    try:
        with loom.group():
            raise KeyboardInterrupt  # leaves the group through finally
    except KeyboardInterrupt:
        pass
    lib = loom._lib.load()
    out["group end"] = lib.loomGroupEnd()  # the group was closed: this end is unmatched
    return out


class Errors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = run_process(error_cases)

    def expect(self, case, *words, code=INVALID_ARGUMENT):
        got = self.out[case]
        self.assertIsNotNone(got, "%s: no LoomError" % case)
        self.assertEqual(got[0], code, got)
        for w in words:
            self.assertIn(w, got[1], "%s: %r does not mention %r" % (case, got[1], w))

    def test_python_side_checks_name_the_argument(self):
        self.expect("op", "op", "median")
        self.expect("op int", "op", "5", "band")
        self.expect("readonly", "recvbuff", "read-only")
        self.expect("size", "recvbuff", "3 elements")
        self.expect("dtype mismatch", "recvbuff", "int32", "float32")
        self.expect("format", "sendbuff", "'h'")
        self.expect("contiguous", "sendbuff", "contiguous")
        self.expect("dtype name", "dtype", "complex64")
        self.expect("not a buffer", "sendbuff", "list")
        self.expect("gather size", "recvbuff", "1 elements", "all_gather needs 2")
        self.expect("uid", "unique_id", "5 bytes")
        self.expect("timeout", "timeout_ms")
        self.expect("mem count", "count", "0")
        self.expect("mem count type", "count", "2.5")
        self.expect("mem count huge", "count", str(1 << 62))
        self.expect("mem dtype", "dtype", "complex64")
        self.expect("a2av counts length", "send_counts", "2 entries for 1 ranks")
        self.expect("a2av negative", "send_counts", "[0] is -1")
        self.expect("a2av counts type", "send_counts", "int")
        self.expect("a2av past end", "send_counts", "ends at element 3", "2 of sendbuff")
        self.expect("a2av displs", "recv_counts", "ends at element 3")
        self.expect("a2av self", "recvcounts[0]", "sends itself 1")
        self.expect("rooted gather size", "recvbuff", "3 elements", "gather needs 2")
        self.expect("gather root", "root", "outside [0, 1)")
        self.expect("scatter size", "sendbuff", "3 elements", "scatter needs 2")
        self.expect("scatter none", "sendbuff", "None")
        self.expect("tag negative", "tag", "-1")
        self.expect("tag type", "tag", "'7'")
        # A bfloat16 buffer's format is 16-bit integers, which Loom does not reduce: never
        # taken for another type, it needs dtype= (as in test_mem_alloc_buffers).
        self.expect("mem bfloat16", "sendbuff", "'H'")
        for case, *words in (("root wraps", "root", str(2**32)),
                             ("peer wraps", "peer", str(2**32 + 1)),
                             ("rank wraps", "rank", str(2**32)),
                             ("world wraps", "world", str(2**32 + 1)),
                             ("timeout wraps", "timeout_ms", str(2**32 + 1)),
                             ("timeout bool", "timeout_ms", "True"),
                             ("key type", "key", "'a'"),
                             ("name type", "name", "5"),
                             ("premul range", "scalar", "1000", "int8"),
                             ("premul type", "scalar", "'abc'"),
                             ("trace path type", "path", "123"),
                             ("pointer negative", "address", "-4096")):
            self.expect(case, *words)

    def test_defects_found_by_probing(self):
        # A destroyed or another communicator's premul_sum reduced with whatever op reused its
        # number; overlapping buffers gave wrong sums; recv(buf) waited for a tagged message no
        # untagged send makes; out-of-range scalars and counts were wrapped or turned to inf.
        for case, *words in (("premul destroyed", "op", "destroyed"),
                             ("premul foreign", "op", "another communicator"),
                             ("overlap", "recvbuff", "overlap sendbuff", "must equal recvbuff"),
                             ("overlap a2a", "recvbuff", "overlap sendbuff", "no in-place form"),
                             ("overlap gather", "recvbuff", "overlap sendbuff"),
                             ("recv untagged any", "tag", "peer None"),
                             ("premul huge", "scalar", "range"),
                             ("premul float32 range", "scalar", "float32"),
                             ("pointer float count", "count", "4.9"),
                             ("pointer count wraps", "count", str(2**64 + 4)),
                             ("pointer none", "address", "None"),
                             ("pointer too big", "count", "more memory"),
                             ("mem count bool", "count", "True")):
            self.expect(case, *words)
        for case in [k for k in self.out if k.startswith("ok ")]:
            self.assertIsNone(self.out[case], "%s: %r" % (case, self.out[case]))
        if numpy is not None:
            self.assertIn("ok numpy root", self.out)
            self.expect("big-endian dtype", "dtype", ">f4")
        self.assertEqual(self.out["pickled"], "x: y")

    def test_library_errors_carry_loom_message(self):
        self.expect("root", "root: 5 is outside [0, 1)")
        self.expect("peer", "peer: 3 is outside [0, 1)")
        self.expect("rank", "rank: 5 is outside [0, 2)")
        self.expect("destroyed", "comm")
        self.expect("band float", "op: loomBand applies to the integer types only")
        self.assertEqual(self.out["group end"], INVALID_USAGE)

    def test_mem_alloc_outlives_atexit_handlers_and_forked_children(self):
        # An atexit handler that reads a mem_alloc array runs before the memory goes (it was
        # unmapped first, and the process died of SIGSEGV); a forked child's exit leaves the
        # parent's buffers named (the child's exit used to unlink them).
        code = ("import atexit, os, sys, numpy, loom\n"
                "m = loom.mem_alloc(1 << 18); a = numpy.frombuffer(m, numpy.float32); a[:] = 2\n"
                "atexit.register(lambda: print('sum', int(a.sum())))\n"
                "names = lambda: sorted(n for n in os.listdir('/dev/shm') if n.startswith('loom-mem'))\n"
                "before = names()\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    del a, m\n"
                "    import gc; gc.collect()\n"
                "    sys.exit(0)\n"
                "os.waitpid(pid, 0)\n"
                "print('kept', names() == before and len(before) > 0)\n")
        if numpy is None:
            self.skipTest("numpy is not installed")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("kept True", p.stdout)
        self.assertIn("sum %d" % (2 * (1 << 18)), p.stdout)

    def test_missing_library_is_named(self):
        env = dict(os.environ, LOOM_LIBRARY="/nonexistent/libloom.so.0")
        p = subprocess.run([sys.executable, "-c", "import loom; loom.version()"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("LoomError", p.stderr)
        self.assertIn("LOOM_LIBRARY", p.stderr)
        self.assertIn("/nonexistent/libloom.so.0", p.stderr)


if __name__ == "__main__":
    unittest.main()
