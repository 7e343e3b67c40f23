"""DLPack inputs over real processes: PyTorch CPU tensors and NumPy arrays
reached only through __dlpack__ go through every kind of collective on 2 ranks,
checked against a reference computed here in plain Python; exports Loom cannot
read (another device, strided, vector or complex types) raise LoomError naming
the argument. Hand-built capsules (with the DLPack structs written out here,
apart from the package's) check byte_offset, strides and the device field."""

import ctypes
import importlib.util
import unittest

import loom
from loom.errors import INVALID_ARGUMENT
from ranks import run_ranks, run_process
import test_loom  # the module only, so its tests are not collected twice

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
N = 2
COUNT = 12
UNSIGNED = ("uint8", "uint32", "uint64")


def value(rank, i, name):
    """Rank rank's element i: small integers, exact in every type (even bfloat16)."""
    v = (rank * 5 + i * 3 + 1) % 7
    return v if name in UNSIGNED else v - 3


def inputs(rank, name, count=COUNT):
    return [value(rank, i, name) for i in range(count)]


class DLPackOnly:
    """Exposes an array through DLPack alone (no buffer protocol), and keeps
    every capsule it hands out so the test can see they were not consumed."""

    def __init__(self, array):
        self.array = array
        self.capsules = []
        self.device_asked = 0

    def __dlpack__(self, stream=None):
        cap = self.array.__dlpack__()
        self.capsules.append(cap)
        return cap

    def __dlpack_device__(self):
        self.device_asked += 1
        return self.array.__dlpack_device__()


class DLPackVersioned(DLPackOnly):
    """As DLPackOnly, with DLPack 1.0's versioned capsules where asked for (max_version)."""

    def __dlpack__(self, stream=None, max_version=None):
        cap = self.array.__dlpack__(max_version=max_version)
        self.capsules.append(cap)
        return cap


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid.restype = ctypes.c_int


# ---- Rank bodies (run in the forked ranks) ----

TORCH_TYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bfloat16")


def body_torch(comm, rank, n):
    import torch
    torch.set_num_threads(1)
    out = {}
    for name in TORCH_TYPES:
        dt = getattr(torch, name)
        send = torch.tensor(inputs(rank, name), dtype=dt).reshape(3, COUNT // 3)
        recv = torch.zeros_like(send)
        comm.all_reduce(send, recv, op="sum")
        out["sum", name] = [float(x) for x in recv.flatten().tolist()]
        comm.all_reduce(send, op="max")  # in place
        out["max", name] = [float(x) for x in send.flatten().tolist()]
    send = torch.tensor(inputs(rank, "float32"), dtype=torch.float32)
    gathered = torch.zeros(n * COUNT, dtype=torch.float32)
    comm.all_gather(send, gathered)
    out["all_gather"] = gathered.tolist()
    scattered = torch.zeros(COUNT // n, dtype=torch.float64)
    comm.reduce_scatter(torch.tensor(inputs(rank, "float64"), dtype=torch.float64), scattered)
    out["reduce_scatter"] = scattered.tolist()
    bcast = torch.tensor(inputs(rank, "int64"), dtype=torch.int64)
    comm.broadcast(bcast, root=1)
    out["broadcast"] = bcast.tolist()
    # A row of a matrix: the export starts inside the storage; the other rows stay as they were.
    m = torch.full((3, COUNT), -9, dtype=torch.int32)
    m[1] = torch.tensor(inputs(rank, "int32"), dtype=torch.int32)
    comm.all_reduce(m[1])
    out["row"] = m.tolist()
    # Send/recv around the ring inside a group: the exports outlive the calls that queued them.
    got = torch.zeros(COUNT, dtype=torch.int64)
    with loom.group():
        comm.send(torch.tensor(inputs(rank, "int64"), dtype=torch.int64), (rank + 1) % n)
        comm.recv(got, (rank - 1) % n)
    out["ring"] = got.tolist()
    return out


NUMPY_TYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64")


def body_numpy(comm, rank, n):
    import numpy
    out, wrappers = {}, []
    for name in NUMPY_TYPES:
        send = DLPackOnly(numpy.array(inputs(rank, name), dtype=name).reshape(2, COUNT // 2))
        recv = DLPackOnly(numpy.zeros((2, COUNT // 2), dtype=name))
        comm.all_reduce(send, recv, op="min")
        out["min", name] = [float(x) for x in recv.array.flatten()]
        wrappers += [send, recv]
    send = DLPackOnly(numpy.array(inputs(rank, "float32"), dtype="float32"))
    recv = DLPackOnly(numpy.zeros(COUNT, dtype="float32"))
    comm.all_to_all(send, recv)
    out["all_to_all"] = [float(x) for x in recv.array]
    wrappers += [send, recv]
    # Every export was asked for its device first, and no capsule was consumed (renamed).
    out["device asked"] = all(w.device_asked == len(w.capsules) == 1 for w in wrappers)
    out["unconsumed"] = all(_capsule_valid(c, b"dltensor") for w in wrappers for c in w.capsules)
    return out


# ---- References ----

def ref_reduce(op, name, ranks):
    cols = zip(*(inputs(r, name) for r in ranks))
    return [float({"sum": sum, "max": max, "min": min}[op](c)) for c in cols]


def ref_reduce_wrapped(name, ranks):
    """Sum in the type's width (int8 wraps)."""
    vals = ref_reduce("sum", name, ranks)
    if name == "int8":
        vals = [float((int(v) + 128) % 256 - 128) for v in vals]
    return vals


class TorchTensors(unittest.TestCase):
    @unittest.skipIf(not HAVE_TORCH, "torch not installed (scripts/setup.sh installs torch 2.13.0 into .venv)")
    def test_collectives_on_torch_cpu_tensors(self):
        ranks = range(N)
        for rank, out in enumerate(run_ranks(N, body_torch)):
            for name in TORCH_TYPES:
                self.assertEqual(out["sum", name], ref_reduce_wrapped(name, ranks), (rank, name))
                self.assertEqual(out["max", name], ref_reduce("max", name, ranks), (rank, name))
            self.assertEqual(out["all_gather"],
                             [float(v) for r in ranks for v in inputs(r, "float32")])
            block = COUNT // N
            self.assertEqual(out["reduce_scatter"],
                             ref_reduce("sum", "float64", ranks)[rank * block:(rank + 1) * block])
            self.assertEqual(out["broadcast"], inputs(1, "int64"))
            self.assertEqual(out["row"], [[-9] * COUNT,
                                          [int(v) for v in ref_reduce("sum", "int32", ranks)],
                                          [-9] * COUNT])
            self.assertEqual(out["ring"], inputs((rank - 1) % N, "int64"))


class NumpyThroughDLPack(unittest.TestCase):
    @unittest.skipIf(not HAVE_NUMPY, "numpy not installed (scripts/setup.sh installs python3-numpy)")
    def test_collectives_on_dlpack_only_numpy_arrays(self):
        import numpy
        if not hasattr(numpy.ndarray, "__dlpack__"):
            self.skipTest("numpy %s has no __dlpack__ (1.22 added it)" % numpy.__version__)
        ranks = range(N)
        for rank, out in enumerate(run_ranks(N, body_numpy)):
            for name in NUMPY_TYPES:
                self.assertEqual(out["min", name], ref_reduce("min", name, ranks), (rank, name))
            block = COUNT // N
            want = [float(v) for r in ranks for v in inputs(r, "float32")[rank * block:(rank + 1) * block]]
            self.assertEqual(out["all_to_all"], want)
            self.assertTrue(out["device asked"])
            self.assertTrue(out["unconsumed"])


# ---- Hand-built exports (the DLPack structs as the protocol lays them out) ----

class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object


class HandMade:
    """A DLPack producer over a ctypes buffer, with every field chosen by the test."""

    def __init__(self, shape, strides=None, device=1, code=2, bits=32, lanes=1, byte_offset=0,
                 with_device=True):
        self.storage = (ctypes.c_uint8 * 256)()
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(strides))(*strides) if strides else None
        m = _Managed()
        t = m.dl_tensor
        t.data = ctypes.addressof(self.storage)
        t.device = _Device(device, 0)
        t.ndim = len(shape)
        t.dtype = _DType(code, bits, lanes)
        t.shape = ctypes.addressof(self.shape)
        t.strides = ctypes.addressof(self.strides) if strides else None
        t.byte_offset = byte_offset
        self.managed = m
        self.device = device
        if with_device:
            self.__dlpack_device__ = lambda: (self.device, 0)

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self.managed), _NAME, None)


class _Raises:
    def __init__(self, exc, device=(1, 0)):
        self.exc, self.device = exc, device

    def __dlpack__(self, stream=None):
        raise self.exc

    def __dlpack_device__(self):
        return self.device


class _NotCapsule:
    def __dlpack__(self, stream=None):
        return 5


def view_of(obj):
    from loom.buffers import View
    with View(obj, "sendbuff", writable=False) as v:
        return v.address, v.count, v.dtype.name.lower()


def dlpack_cases():
    comm = loom.Communicator(0, 1, loom.unique_id())
    out = {}

    def attempt(name, call):
        try:
            call()
            out[name] = None
        except loom.LoomError as e:
            out[name] = (e.code, e.message)

    # Accepted: byte_offset is added, explicit C-contiguous strides and any stride on extent 1.
    h = HandMade((2, 3), strides=(3, 1), byte_offset=8)
    out["offset"] = (view_of(h), ctypes.addressof(h.storage) + 8)
    h1 = HandMade((4, 1), strides=(1, 99), code=0, bits=64)
    out["extent 1"] = (view_of(h1), ctypes.addressof(h1.storage))
    out["bfloat"] = view_of(HandMade((5,), code=4, bits=16))[1:]
    # Refused, each naming the argument.
    attempt("device asked", lambda: comm.all_reduce(_Raises(AssertionError("exported"), (2, 1))))
    attempt("device in tensor", lambda: comm.all_reduce(HandMade((4,), device=2, with_device=False)))
    attempt("strided", lambda: comm.all_reduce(HandMade((2, 2), strides=(1, 2))))
    attempt("lanes", lambda: comm.all_reduce(HandMade((4,), lanes=4)))
    attempt("complex", lambda: comm.all_reduce(HandMade((4,), code=5, bits=64)))
    attempt("raises", lambda: comm.all_reduce(_Raises(BufferError("no export today"))))
    attempt("not capsule", lambda: comm.all_reduce(_NotCapsule()))
    try:
        import torch
        t = torch.zeros(4, 4)
        attempt("torch transposed", lambda: comm.all_reduce(t, t.t()))
        attempt("torch complex", lambda: comm.all_reduce(torch.zeros(4, dtype=torch.complex64)))
        attempt("torch mismatch", lambda: comm.all_reduce(t, torch.zeros(16, dtype=torch.int32)))
    except ImportError:
        pass
    try:
        import numpy
        ro = numpy.zeros(4, dtype="float32")
        ro.flags.writeable = False
        attempt("numpy readonly", lambda: comm.all_reduce(DLPackOnly(ro)))
        # DLPack 1.0 says when memory is read-only: taken as an input, refused as an output.
        src = numpy.arange(6, dtype="float32")
        src.flags.writeable = False
        dst = numpy.zeros(6, dtype="float32")
        vsrc, vdst = DLPackVersioned(src), DLPackVersioned(dst)
        try:
            vsrc.__dlpack__(max_version=(1, 0))
            vsrc.capsules.clear()
            attempt("versioned readonly input", lambda: comm.all_reduce(vsrc, vdst))
            out["versioned values"] = dst.tolist()
            out["versioned capsules"] = [_capsule_valid(c, b"dltensor_versioned")
                                         for c in vsrc.capsules + vdst.capsules]
            attempt("versioned readonly output", lambda: comm.all_reduce(DLPackVersioned(src)))
        except TypeError:  # a NumPy from before DLPack 1.0
            pass
    except ImportError:
        pass
    comm.destroy()
    return out


class Errors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = run_process(dlpack_cases)

    def expect(self, case, *words):
        if case not in self.out:
            self.skipTest("%s: producer not installed" % case)
        test_loom.Errors.expect(self, case, *words, code=INVALID_ARGUMENT)

    def test_hand_made_exports_are_read_as_laid_out(self):
        (address, count, dtype), want = self.out["offset"]
        self.assertEqual((address, count, dtype), (want, 6, "float32"))
        (address, count, dtype), want = self.out["extent 1"]
        self.assertEqual((address, count, dtype), (want, 4, "int64"))
        self.assertEqual(self.out["bfloat"], (5, "bfloat16"))

    def test_unreadable_exports_name_the_argument(self):
        self.expect("device asked", "sendbuff", "cuda:1")
        self.expect("device in tensor", "sendbuff", "cuda:0", "CPU")
        self.expect("strided", "sendbuff", "not contiguous")
        self.expect("lanes", "sendbuff", "float32x4")
        self.expect("complex", "sendbuff", "complex64")
        self.expect("raises", "sendbuff", "no export today")
        self.expect("not capsule", "sendbuff", "dltensor")

    def test_torch_errors(self):
        self.expect("torch transposed", "recvbuff", "not contiguous")
        self.expect("torch complex", "sendbuff", "complex")
        self.expect("torch mismatch", "recvbuff", "int32", "float32")

    def test_numpy_readonly(self):
        self.expect("numpy readonly", "sendbuff", "__dlpack__() failed")

    def test_versioned_capsules_and_their_read_only_flag(self):
        if "versioned readonly input" not in self.out:
            self.skipTest("numpy without DLPack 1.0 (max_version)")
        self.assertIsNone(self.out["versioned readonly input"])
        self.assertEqual(self.out["versioned values"], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        self.assertEqual(self.out["versioned capsules"], [1, 1])  # versioned, not consumed
        self.expect("versioned readonly output", "read-only", "writes the result")


if __name__ == "__main__":
    unittest.main()
