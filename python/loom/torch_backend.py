"""A torch.distributed backend named "loom", for CPU tensors.

    import loom.torch_backend           # registers the backend
    torch.distributed.init_process_group("loom", rank=r, world_size=n, init_method=...)

The process group is a Python subclass of torch.distributed.ProcessGroup (the
torch 1.13 API, where c10d dispatches each collective to Python overrides).
Every collective runs to completion on Loom before it returns, so each Work it
hands back is already complete: wait() returns at once and get_future() holds
the output tensors. Rank 0 makes Loom's unique id and shares it through the
store torch gives the backend.

Only this module knows torch; it turns tensors into loom.Pointer and calls the
Communicator, so a torch 2.x Backend class can be added beside it.
"""

import datetime

import torch
import torch.distributed as dist

from .buffers import Pointer
from .comm import Communicator, ReduceOp, unique_id
from .errors import LoomError, INVALID_ARGUMENT

_DTYPES = {
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64",
}

_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.PRODUCT: ReduceOp.PROD,
    dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.MIN: ReduceOp.MIN,
}
if hasattr(dist.ReduceOp, "AVG"):
    _OPS[dist.ReduceOp.AVG] = ReduceOp.AVG


def _ptr(t, arg):
    """A loom.Pointer over a contiguous CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise LoomError(INVALID_ARGUMENT, "%s: %r is not a tensor" % (arg, type(t).__name__))
    if t.device.type != "cpu":
        raise LoomError(INVALID_ARGUMENT, "%s: tensor on %s; the loom backend moves CPU tensors"
                        % (arg, t.device))
    if not t.is_contiguous():
        raise LoomError(INVALID_ARGUMENT, "%s: tensor is not contiguous" % arg)
    if t.dtype not in _DTYPES:
        raise LoomError(INVALID_ARGUMENT, "%s: %s has no Loom data type" % (arg, t.dtype))
    return Pointer(t.data_ptr(), t.numel(), _DTYPES[t.dtype])


def _op(reduce_op):
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    raise LoomError(INVALID_ARGUMENT, "op: %s is not supported by the loom backend" % reduce_op)


def _flat(tensors, arg):
    """One contiguous tensor holding the list's tensors end to end (copied)."""
    if not tensors:
        raise LoomError(INVALID_ARGUMENT, "%s: empty tensor list" % arg)
    return torch.cat([t.reshape(-1) for t in tensors])


def LoomWork(result):
    """A finished operation: wait() returns at once, get_future() holds result.

    torch 1.13 cannot override Work.wait from Python (c10d calls the C++ one),
    so the Work wraps an already completed future, which every version's
    C++ side can wait on."""
    future = torch.futures.Future()
    future.set_result(result)
    return _work_from_future(future)


_work_from_future = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
if _work_from_future is None:  # a torch without it lets Python override Work itself
    class _DoneWork(dist.Work):
        def __init__(self, future):
            super().__init__()
            self._future = future

        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def is_success(self):
            return True

        def result(self):
            return self._future.value()

        def get_future(self):
            return self._future

    _work_from_future = _DoneWork


class ProcessGroupLoom(dist.ProcessGroup):
    """torch.distributed's ProcessGroup over one Loom communicator."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        key = "loom_unique_id"
        if rank == 0:
            uid = unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) else None
        self._comm = Communicator(rank, size, uid, timeout_ms=ms, name="torch")

    def getBackendName(self):
        return "loom"

    def _get_backend_name(self):
        return "loom"

    # ---- Collectives: each takes torch's argument lists and options ----
    def broadcast(self, tensors, opts):
        root = opts.rootRank
        for i, t in enumerate(tensors):
            p = _ptr(t, "tensors[%d]" % i)
            self._comm.broadcast(p, root=root)
        return LoomWork(tensors)

    def allreduce(self, tensors, opts):
        op = _op(opts.reduceOp)
        for i, t in enumerate(tensors):
            self._comm.all_reduce(_ptr(t, "tensors[%d]" % i), op=op)
        return LoomWork(tensors)

    def allreduce_coalesced(self, tensors, opts):
        flat = _flat(tensors, "tensors")
        self._comm.all_reduce(_ptr(flat, "tensors"), op=_op(opts.reduceOp))
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return LoomWork(tensors)

    def reduce(self, tensors, opts):
        op = _op(opts.reduceOp)
        for i, t in enumerate(tensors):
            self._comm.reduce(_ptr(t, "tensors[%d]" % i), op=op, root=opts.rootRank)
        return LoomWork(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for i, (outs, t) in enumerate(zip(output_tensors, input_tensors)):
            flat = torch.empty(t.numel() * self.size(), dtype=t.dtype)
            self._comm.all_gather(_ptr(t.contiguous(), "input_tensors[%d]" % i), _ptr(flat, "output"))
            for r, o in enumerate(outs):
                o.copy_(flat[r * t.numel():(r + 1) * t.numel()].view_as(o))
        return LoomWork(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        self._comm.all_gather(_ptr(input, "input"), _ptr(output, "output"))
        return LoomWork([output])

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        op = _op(opts.reduceOp)
        for i, (out, ins) in enumerate(zip(output_tensors, input_tensors)):
            flat = _flat(ins, "input_tensors[%d]" % i)
            self._comm.reduce_scatter(_ptr(flat, "input"), _ptr(out, "output_tensors[%d]" % i),
                                      op=op)
        return LoomWork(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        self._comm.reduce_scatter(_ptr(input, "input"), _ptr(output, "output"),
                                  op=_op(opts.reduceOp))
        return LoomWork([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        send = _flat(input_tensors, "input_tensors")
        recv = torch.empty(sum(o.numel() for o in output_tensors), dtype=send.dtype)
        sizes = {t.numel() for t in list(output_tensors) + list(input_tensors)}
        if len(sizes) == 1:
            self._comm.all_to_all(_ptr(send, "input"), _ptr(recv, "output"))
        else:
            self._comm.all_to_all_v(_ptr(send, "input"), [t.numel() for t in input_tensors],
                                    _ptr(recv, "output"), [o.numel() for o in output_tensors])
        offset = 0
        for o in output_tensors:
            o.copy_(recv[offset:offset + o.numel()].view_as(o))
            offset += o.numel()
        return LoomWork(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not output_split_sizes and not input_split_sizes:
            self._comm.all_to_all(_ptr(input, "input"), _ptr(output, "output"))
            return LoomWork([output])
        # Splits count rows (the first dimension); absent, the rows split equally.
        self._comm.all_to_all_v(_ptr(input, "input"), self._split(input, input_split_sizes, "input"),
                                _ptr(output, "output"),
                                self._split(output, output_split_sizes, "output"))
        return LoomWork([output])

    def _split(self, t, splits, arg):
        n = self.size()
        rows = t.size(0) if t.dim() > 0 else 1
        row = t.numel() // rows if rows else 0
        if not splits:
            if rows % n:
                raise LoomError(INVALID_ARGUMENT, "%s_split_sizes: none given, and %d rows do not "
                                "split into %d equal blocks" % (arg, rows, n))
            return [rows // n * row] * n
        if len(splits) != n or sum(splits) != rows:
            raise LoomError(INVALID_ARGUMENT, "%s_split_sizes: %s for %d ranks and %d rows"
                            % (arg, list(splits), n, rows))
        return [s * row for s in splits]

    def gather(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        t = input_tensors[0].contiguous()
        if self.rank() != root:
            self._comm.gather(_ptr(t, "input_tensors[0]"), None, root=root)
            return LoomWork(output_tensors)
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype)
        self._comm.gather(_ptr(t, "input_tensors[0]"), _ptr(flat, "output"), root=root)
        for r, o in enumerate(output_tensors[0]):
            o.copy_(flat[r * t.numel():(r + 1) * t.numel()].view_as(o))
        return LoomWork(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        out = output_tensors[0]
        send = _flat(input_tensors[0], "input_tensors[0]") if self.rank() == root else None
        self._comm.scatter(_ptr(send, "input") if send is not None else None,
                           _ptr(out, "output_tensors[0]"), root=root)
        return LoomWork(output_tensors)

    def barrier(self, opts=None):
        self._comm.barrier()
        return LoomWork([])

    def send(self, tensors, dst, tag=0):
        for i, t in enumerate(tensors):
            self._comm.send(_ptr(t, "tensors[%d]" % i), dst)
        return LoomWork(tensors)

    def recv(self, tensors, src, tag=0):
        for i, t in enumerate(tensors):
            self._comm.recv(_ptr(t, "tensors[%d]" % i), src)
        return LoomWork(tensors)

    def destroy(self):
        self._comm.destroy()


def _create(store, rank, size, timeout):
    return ProcessGroupLoom(store, rank, size, timeout)


def register():
    """Registers the "loom" backend with torch.distributed (once)."""
    if not hasattr(dist.Backend, "LOOM"):  # register_backend sets Backend.LOOM
        dist.Backend.register_backend("loom", _create)


register()
