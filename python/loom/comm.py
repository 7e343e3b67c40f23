"""Communicators and their collectives over Loom's C API."""

import contextlib
import ctypes
import enum
import math
import numbers
import os

from . import _lib
from .buffers import View, as_index, group_enter, group_exit, in_group, to_dtype
from .errors import LoomError, INVALID_ARGUMENT, check


class ReduceOp(enum.IntEnum):
    """loomRedOp_t's built-in operations."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 0x40000000
    BOR = 0x40000001
    BXOR = 0x40000002


_OP_NAMES = {"sum": ReduceOp.SUM, "prod": ReduceOp.PROD, "product": ReduceOp.PROD,
             "max": ReduceOp.MAX, "min": ReduceOp.MIN, "avg": ReduceOp.AVG, "mean": ReduceOp.AVG,
             "band": ReduceOp.BAND, "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR}
_OP_VALUES = frozenset(int(o) for o in ReduceOp)


def _op(op, comm):
    if isinstance(op, PreMulSum):
        if op.comm is None:
            raise LoomError(INVALID_ARGUMENT, "op: this premul_sum was destroyed")
        if op.comm is not comm:
            raise LoomError(INVALID_ARGUMENT, "op: this premul_sum belongs to another communicator")
        return op.value
    if isinstance(op, ReduceOp):
        return int(op)
    if isinstance(op, str) and op.lower() in _OP_NAMES:
        return int(_OP_NAMES[op.lower()])
    if isinstance(op, int) and not isinstance(op, bool) and op in _OP_VALUES:
        return op
    raise LoomError(INVALID_ARGUMENT, "op: %r is not a reduction (sum, prod, max, min, avg, "
                    "band, bor, bxor, a ReduceOp or a PreMulSum)" % (op,))


def _int32(value, name, low=-2**31):
    """value, checked to be an integer that C's int holds (ctypes would wrap it silently)."""
    v = as_index(value)
    if v is None or not low <= v < 2**31:
        raise LoomError(INVALID_ARGUMENT, "%s: %r is not an int in [%d, 2**31)" % (name, value, low))
    return v


def _text(value, name):
    """value (str or None) as bytes for C, or LoomError naming the argument."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise LoomError(INVALID_ARGUMENT, "%s: %r is not a str" % (name, value))
    return value.encode()


def unique_id():
    """A new communicator id (128 bytes). The calling process hosts the
    rendezvous until every rank has joined; pass the bytes to every rank."""
    uid = _lib.UniqueIdStruct()
    check(_lib.load().loomGetUniqueId(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES)


def version():
    """Loom's version as major * 10000 + minor * 100 + patch."""
    v = ctypes.c_int()
    check(_lib.load().loomGetVersion(ctypes.byref(v)))
    return v.value


@contextlib.contextmanager
def group():
    """Calls inside the block are issued together at its end (loomGroupStart/End),
    so matching sends and receives between ranks cannot deadlock. The buffers
    they name are held until then; a loom.Pointer's memory is the caller's to
    keep alive."""
    lib = _lib.load()
    check(lib.loomGroupStart())
    group_enter()
    try:
        yield
    finally:
        try:
            check(lib.loomGroupEnd())
        finally:
            group_exit()


def _config(timeout_ms, name, blocking=None):
    cfg = _lib.ConfigStruct()
    cfg.size = ctypes.sizeof(_lib.ConfigStruct)
    cfg.magic = _lib.CONFIG_MAGIC
    cfg.version = version()
    cfg.blocking = _lib.CONFIG_UNDEF_INT if blocking is None else int(blocking)
    cfg._name = _text(name, "name")  # kept alive with cfg
    cfg.commName = cfg._name
    if timeout_ms is not None:
        _int32(timeout_ms, "timeout_ms", 1)
    cfg.timeoutMs = _lib.CONFIG_UNDEF_INT if timeout_ms is None else timeout_ms
    return cfg


class PreMulSum:
    """A reduction that multiplies each rank's input by `scalar`, then sums.
    Made by Communicator.premul_sum; belongs to that communicator and dtype."""

    def __init__(self, comm, value, dtype):
        self.comm, self.value, self.dtype = comm, value, dtype

    def destroy(self):
        if self.comm is not None and self.comm._handle:
            check(_lib.load().loomRedOpDestroy(self.value, self.comm._handle))
        self.comm = None


class Communicator:
    """One rank of a communicator.

    Communicator(rank, world, unique_id) joins the communicator whose id rank 0
    (or anyone) made with loom.unique_id(); Communicator.from_env() builds it
    from a launcher's variables (LOOM_*, torchrun, Open MPI, Slurm). Calls on a
    communicator block until done; results land in the output buffers.
    A communicator is used by one thread at a time.
    """

    def __init__(self, rank, world, unique_id, *, timeout_ms=None, name=None, _handle=None):
        self._lib = _lib.load()
        self._handle = None
        self._rank = self._size = None
        if _handle is not None:
            self._handle = _handle
            return
        for arg, v in (("rank", rank), ("world", world)):
            _int32(v, arg)
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != _lib.UNIQUE_ID_BYTES:
            raise LoomError(INVALID_ARGUMENT, "unique_id: want the %d bytes of loom.unique_id(), got %r"
                            % (_lib.UNIQUE_ID_BYTES, type(unique_id).__name__ if not isinstance(
                                unique_id, (bytes, bytearray)) else "%d bytes" % len(unique_id)))
        uid = _lib.UniqueIdStruct.from_buffer_copy(bytes(unique_id))
        cfg = _config(timeout_ms, name)
        h = ctypes.c_void_p()
        check(self._lib.loomCommInitRankConfig(ctypes.byref(h), world, uid, rank, ctypes.byref(cfg)))
        self._handle = h.value

    @classmethod
    def from_env(cls, *, timeout_ms=None, name=None):
        """This process's rank of the world communicator, from its launcher's variables."""
        lib = _lib.load()
        cfg = _config(timeout_ms, name)
        h = ctypes.c_void_p()
        check(lib.loomCommInitFromEnv(ctypes.byref(h), ctypes.byref(cfg)))
        return cls(None, None, None, _handle=h.value)

    # ---- Properties ----
    def _int(self, fn):
        v = ctypes.c_int()
        check(fn(self._h(), ctypes.byref(v)))
        return v.value

    def _h(self):
        if not self._handle:
            raise LoomError(INVALID_ARGUMENT, "comm: the communicator was destroyed")
        return self._handle

    # A communicator's rank and size never change: asked of the library once (the collectives'
    # checks read them on every call).
    @property
    def rank(self):
        self._h()
        if self._rank is None:
            self._rank = self._int(self._lib.loomCommUserRank)
        return self._rank

    @property
    def size(self):
        self._h()
        if self._size is None:
            self._size = self._int(self._lib.loomCommCount)
        return self._size

    world = size

    @property
    def device(self):
        """The CUDA device of this rank, -1 without one."""
        return self._int(self._lib.loomCommCuDevice)

    def async_error(self):
        """The communicator's stored asynchronous error code (0 when none)."""
        return self._int(self._lib.loomCommGetAsyncError)

    # ---- Life ----
    def split(self, color, key=0, *, timeout_ms=None, name=None):
        """Ranks of one color form a new communicator, ordered by key. color=None
        (LOOM_SPLIT_NOCOLOR) takes no part and returns None. Collective."""
        c = -1 if color is None else as_index(color)
        if c is None or not -1 <= c < 2**31:
            raise LoomError(INVALID_ARGUMENT, "color: %r is not a non-negative int or None" % (color,))
        key = _int32(key, "key")
        # What is not given (None) the child takes from the parent.
        cfg = _config(timeout_ms, name)
        h = ctypes.c_void_p()
        check(self._lib.loomCommSplit(self._h(), c, key, ctypes.byref(h), ctypes.byref(cfg)))
        return Communicator(None, None, None, _handle=h.value) if h.value else None

    def destroy(self):
        """Frees the communicator (finalizing it first). Safe to call twice."""
        if self._handle:
            h, self._handle = self._handle, None
            try:
                check(self._lib.loomCommFinalize(h))  # raises the communicator's error, if any
            finally:
                check(self._lib.loomCommDestroy(h))  # frees it whatever finalize said

    close = destroy

    def abort(self):
        """Aborts outstanding operations and frees the communicator; peers see an error."""
        if self._handle:
            h, self._handle = self._handle, None
            check(self._lib.loomCommAbort(h))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception, the peers may be waiting in an operation this rank will never
        # join: abort, so that they fail at once (a destroy would finalize, and wait for them).
        if exc_type is not None:
            self.abort()
        else:
            self.destroy()

    def set_op_tag(self, tag):
        """Names the next operation issued on this communicator with the caller's own number for
        it (0 clears it): its flight-recorder entry and trace dump carry it as "tag", and
        loom-trace shows it beside Loom's sequence number."""
        t = as_index(tag)
        if t is None or not 0 <= t < 1 << 64:
            raise LoomError(INVALID_ARGUMENT,
                            "tag: %r is not an integer in [0, 2**64)" % (tag,))
        check(self._lib.loomCommSetOpTag(self._h(), t))

    def dump_trace(self, path=None):
        """Writes this rank's flight recorder as JSON (LOOM_TRACE_DIR when path is None)."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        check(self._lib.loomCommDumpTrace(self._h(), _text(path or None, "path")))

    def premul_sum(self, scalar, dtype):
        """A reduction op: sum of scalar * input, for buffers of dtype."""
        dt = to_dtype(dtype)
        fmt = {"FLOAT32": ctypes.c_float, "FLOAT64": ctypes.c_double, "INT32": ctypes.c_int32,
               "UINT32": ctypes.c_uint32, "INT64": ctypes.c_int64, "UINT64": ctypes.c_uint64,
               "INT8": ctypes.c_int8, "UINT8": ctypes.c_uint8}.get(dt.name)
        if fmt is None:
            raise LoomError(INVALID_ARGUMENT, "dtype: premul_sum takes its scalar as a Python "
                            "number for 8/32/64-bit integer and 32/64-bit float types, not %s"
                            % dt.name.lower())
        if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):  # NumPy's too
            raise LoomError(INVALID_ARGUMENT, "scalar: %r is not a number" % (scalar,))
        if issubclass(fmt, (ctypes.c_float, ctypes.c_double)):
            try:
                s = fmt(float(scalar))
            except OverflowError:
                s = None
            if s is None or (math.isinf(s.value) and not math.isinf(float(scalar))):
                raise LoomError(INVALID_ARGUMENT, "scalar: %r is beyond %s's range"
                                % (scalar, dt.name.lower()))
        else:
            s = fmt(int(scalar)) if isinstance(scalar, numbers.Integral) else None
            if s is None or s.value != int(scalar):
                raise LoomError(INVALID_ARGUMENT, "scalar: %r is not a value of %s"
                                % (scalar, dt.name.lower()))
        op = ctypes.c_int()
        check(self._lib.loomRedOpCreatePreMulSum(ctypes.byref(op), ctypes.byref(s), int(dt), 1,
                                                 self._h()))
        return PreMulSum(self, op.value, dt)

    # ---- Collectives ----
    @staticmethod
    def _same(send, recv, want_recv, what):
        if send.dtype != recv.dtype:
            raise LoomError(INVALID_ARGUMENT, "recvbuff: holds %s, sendbuff holds %s"
                            % (recv.dtype.name.lower(), send.dtype.name.lower()))
        if recv.count != want_recv:
            raise LoomError(INVALID_ARGUMENT, "recvbuff: %d elements, %s needs %d"
                            % (recv.count, what, want_recv))

    @contextlib.contextmanager
    def _views(self, send, recv, dtype):
        """Views of send and recv (recv None: in place), released on exit."""
        with View(send, "sendbuff", writable=recv is None, dtype=dtype) as s:
            if recv is None:
                yield s, s
                return
            with View(recv, "recvbuff", writable=True, dtype=dtype) as r:
                yield s, r

    def _blocks(self, s):
        n = self.size
        if s.count % n:
            raise LoomError(INVALID_ARGUMENT, "sendbuff: %d elements do not split into %d "
                            "equal blocks" % (s.count, n))
        return s.count // n

    def all_reduce(self, send, recv=None, op="sum", *, dtype=None):
        """recv[i] = op over ranks of send[i]; in place when recv is None."""
        o = _op(op, self)
        with self._views(send, recv, dtype) as (s, r):
            self._same(s, r, s.count, "all_reduce")
            check(self._lib.loomAllReduce(s.address, r.address, s.count, s.dtype, o, self._h(),
                                          None))

    def broadcast(self, send, recv=None, root=0, *, dtype=None):
        """Copies root's send into every rank's recv (into send when recv is None)."""
        with self._views(send, recv, dtype) as (s, r):
            self._same(s, r, s.count, "broadcast")
            check(self._lib.loomBroadcast(s.address, r.address, s.count, s.dtype,
                                          self._root(root), self._h(), None))

    def reduce(self, send, recv=None, op="sum", root=0, *, dtype=None):
        """Reduces every rank's send into root's recv (into send when recv is None)."""
        o = _op(op, self)
        with self._views(send, recv, dtype) as (s, r):
            self._same(s, r, s.count, "reduce")
            check(self._lib.loomReduce(s.address, r.address, s.count, s.dtype, o,
                                       self._root(root), self._h(), None))

    def all_gather(self, send, recv, *, dtype=None):
        """recv = every rank's send, in rank order (recv holds size * len(send))."""
        with self._views(send, self._out(recv), dtype) as (s, r):
            self._same(s, r, s.count * self.size, "all_gather")
            check(self._lib.loomAllGather(s.address, r.address, s.count, s.dtype, self._h(), None))

    def reduce_scatter(self, send, recv, op="sum", *, dtype=None):
        """recv = block `rank` of op over ranks of send (send holds size * len(recv))."""
        o = _op(op, self)
        with self._views(send, self._out(recv), dtype) as (s, r):
            self._same(s, r, self._blocks(s), "reduce_scatter")
            check(self._lib.loomReduceScatter(s.address, r.address, r.count, s.dtype, o,
                                              self._h(), None))

    def all_to_all(self, send, recv, *, dtype=None):
        """Block j of this rank's send goes to rank j, landing in its recv's block `rank`."""
        with self._views(send, self._out(recv), dtype) as (s, r):
            self._same(s, r, s.count, "all_to_all")
            check(self._lib.loomAllToAll(s.address, r.address, self._blocks(s), s.dtype,
                                         self._h(), None))

    def all_to_all_v(self, send, send_counts, recv, recv_counts, *, send_displs=None,
                     recv_displs=None, dtype=None):
        """Unequal blocks (loomAllToAllv): send_counts[j] elements of send, from send_displs[j]
        (default: the blocks end to end), go to rank j, which receives them at
        recv_displs[rank] of its recv (recv_counts[rank] elements, equal to what this rank
        sends it)."""
        with self._views(send, self._out(recv), dtype) as (s, r):
            self._same(s, r, r.count, "all_to_all_v")
            arrays = [self._layout(send_counts, send_displs, s.count, "send"),
                      self._layout(recv_counts, recv_displs, r.count, "recv")]
            sc, sd, rc, rd = [(ctypes.c_size_t * self.size)(*x) for pair in arrays for x in pair]
            check(self._lib.loomAllToAllv(s.address, sc, sd, r.address, rc, rd, s.dtype,
                                          self._h(), None))

    def gather(self, send, recv=None, root=0, *, dtype=None):
        """Every rank's send, in rank order, into root's recv (size * len(send) elements;
        recv is not read on other ranks and may be None there)."""
        root = self._root(root)
        with View(send, "sendbuff", writable=False, dtype=dtype) as s:
            if self.rank != root:
                check(self._lib.loomGather(s.address, None, s.count, s.dtype, root, self._h(), None))
                return
            with View(self._out(recv), "recvbuff", writable=True, dtype=dtype) as r:
                self._same(s, r, s.count * self.size, "gather")
                check(self._lib.loomGather(s.address, r.address, s.count, s.dtype, root, self._h(),
                                           None))

    def scatter(self, send, recv, root=0, *, dtype=None):
        """Block j of root's send (size * len(recv) elements) into rank j's recv; send is not
        read on other ranks and may be None there."""
        root = self._root(root)
        with View(self._out(recv), "recvbuff", writable=True, dtype=dtype) as r:
            if self.rank != root:
                check(self._lib.loomScatter(None, r.address, r.count, r.dtype, root, self._h(),
                                            None))
                return
            with View(send, "sendbuff", writable=False, dtype=dtype) as s:
                if s.dtype != r.dtype:
                    raise LoomError(INVALID_ARGUMENT, "recvbuff: holds %s, sendbuff holds %s"
                                    % (r.dtype.name.lower(), s.dtype.name.lower()))
                if s.count != r.count * self.size:
                    raise LoomError(INVALID_ARGUMENT, "sendbuff: %d elements, scatter needs %d "
                                    "(size * len(recvbuff))" % (s.count, r.count * self.size))
                check(self._lib.loomScatter(s.address, r.address, r.count, r.dtype, root,
                                            self._h(), None))

    def _layout(self, counts, displs, total, side):
        """The blocks' counts and offsets (displs, or the blocks end to end), as lists checked
        against the buffer's `total` elements; errors name the argument."""
        n = self.size

        def ints(seq, name):
            try:
                items = list(seq)
            except TypeError:
                raise LoomError(INVALID_ARGUMENT, "%s: %r is not a sequence of ints"
                                % (name, type(seq).__name__)) from None
            if len(items) != n:
                raise LoomError(INVALID_ARGUMENT, "%s: %d entries for %d ranks" % (name, len(items), n))
            for j, x in enumerate(items):
                items[j] = as_index(x)
                if items[j] is None or items[j] < 0:
                    raise LoomError(INVALID_ARGUMENT, "%s: [%d] is %r, not an int >= 0" % (name, j, x))
            return items

        counts = ints(counts, "%s_counts" % side)
        if displs is None:
            offsets = [sum(counts[:j]) for j in range(n)]
        else:
            offsets = ints(displs, "%s_displs" % side)
        for j in range(n):
            if offsets[j] + counts[j] > total:
                raise LoomError(INVALID_ARGUMENT, "%s_counts: block %d ends at element %d, past "
                                "the %d of %sbuff" % (side, j, offsets[j] + counts[j], total, side))
        return counts, offsets

    def send(self, buf, peer, *, dtype=None, tag=None):
        """Sends buf to peer: matched in order with peer's recv, or, with a tag, a message
        matched by tag (loomSendTagged) that needs no receive posted yet."""
        with View(buf, "sendbuff", writable=False, dtype=dtype) as v:
            if tag is None:
                check(self._lib.loomSend(v.address, v.count, v.dtype, self._peer(peer),
                                         self._h(), None))
            else:
                check(self._lib.loomSendTagged(v.address, v.count, v.dtype, self._peer(peer),
                                               self._tag(tag), self._h(), None))

    def recv(self, buf, peer=None, *, dtype=None, tag=None):
        """Receives len(buf) elements into buf: from peer, matched in order with its send; or,
        with a tag, the message of that tag from peer, or from any rank when peer is None
        (loomRecvTagged). Returns the sender's rank (None for a tagged receive
        inside loom.group(), which runs at the group's end)."""
        if peer is None and tag is None:
            raise LoomError(INVALID_ARGUMENT, "tag: None with peer None; a receive from any rank "
                            "takes a tagged message (send(..., tag=t), recv(buf, tag=t)), and an "
                            "untagged send is received from its peer (recv(buf, peer))")
        with View(buf, "recvbuff", writable=True, dtype=dtype) as v:
            if tag is None:
                check(self._lib.loomRecv(v.address, v.count, v.dtype, self._peer(peer),
                                         self._h(), None))
                return peer
            grouped = in_group()
            source = ctypes.c_int(-1)
            src = -1 if peer is None else self._peer(peer)  # LOOM_ANY_SOURCE
            check(self._lib.loomRecvTagged(v.address, v.count, v.dtype, src,
                                           self._tag(tag),
                                           None if grouped else ctypes.byref(source), self._h(),
                                           None))
            return None if grouped else source.value

    def barrier(self):
        """Returns once every rank has entered the barrier."""
        check(self._lib.loomBarrier(self._h(), None))

    @staticmethod
    def _out(recv):
        if recv is None:
            raise LoomError(INVALID_ARGUMENT, "recvbuff: None; this collective needs an output "
                            "buffer of its own size")
        return recv

    @staticmethod
    def _root(root):
        return _int32(root, "root")

    @staticmethod
    def _tag(tag):
        return _int32(tag, "tag")

    @staticmethod
    def _peer(peer):
        return _int32(peer, "peer")

    def __repr__(self):
        if not self._handle:
            return "<loom.Communicator destroyed>"
        return "<loom.Communicator rank %d of %d>" % (self.rank, self.size)
