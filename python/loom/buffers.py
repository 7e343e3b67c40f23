"""Turns the caller's buffers into (address, element count, Loom data type).

Anything that exposes the buffer protocol works (bytearray, array.array,
memoryview, NumPy arrays, mmap, ...): it must be C-contiguous, writable where
Loom writes into it, and its format gives the data type unless `dtype` names
one. Objects without the buffer protocol that expose DLPack (`__dlpack__`:
PyTorch tensors, ...) must be in CPU memory and contiguous (see dlpack.py). A
`Pointer` passes raw memory (how the PyTorch layer passes tensors).
"""

import ctypes
import enum
import operator
import sys
import threading
import weakref

from .errors import LoomError, INVALID_ARGUMENT


class DataType(enum.IntEnum):
    """loomDataType_t."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    FLOAT8_E4M3 = 10
    FLOAT8_E5M2 = 11


SIZES = {
    DataType.INT8: 1, DataType.UINT8: 1, DataType.INT32: 4, DataType.UINT32: 4,
    DataType.INT64: 8, DataType.UINT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4,
    DataType.FLOAT64: 8, DataType.BFLOAT16: 2, DataType.FLOAT8_E4M3: 1, DataType.FLOAT8_E5M2: 1,
}

_NAMES = {
    "int8": DataType.INT8, "char": DataType.INT8, "uint8": DataType.UINT8,
    "int32": DataType.INT32, "int": DataType.INT32, "uint32": DataType.UINT32,
    "int64": DataType.INT64, "uint64": DataType.UINT64,
    "float16": DataType.FLOAT16, "half": DataType.FLOAT16,
    "float32": DataType.FLOAT32, "float": DataType.FLOAT32,
    "float64": DataType.FLOAT64, "double": DataType.FLOAT64,
    "bfloat16": DataType.BFLOAT16,
    "float8_e4m3": DataType.FLOAT8_E4M3, "float8_e5m2": DataType.FLOAT8_E5M2,
}

# Buffer-protocol format codes -> (signed integer, unsigned integer, float) by kind.
_SIGNED = "bhilqn"
_UNSIGNED = "BHILQN"
_INT_BY_SIZE = {1: (DataType.INT8, DataType.UINT8), 4: (DataType.INT32, DataType.UINT32),
                8: (DataType.INT64, DataType.UINT64)}
_FLOATS = {"e": DataType.FLOAT16, "f": DataType.FLOAT32, "d": DataType.FLOAT64}


def as_index(value):
    """value as a Python int when it is an integer (int, NumPy's integer scalars: anything with
    __index__) and not a bool (Python's or NumPy's); None otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def to_dtype(dtype, arg="dtype"):
    """A DataType from a DataType, its int value, a name ("float32", "bfloat16", ...), or a
    NumPy dtype or scalar type of such a name (numpy.float32, numpy.dtype("int8"))."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _NAMES:
        return _NAMES[dtype.lower()]
    if (isinstance(dtype, type) and dtype.__module__ == "numpy") or \
            type(dtype).__module__.startswith("numpy"):
        import numpy  # the object is NumPy's: NumPy is there
        try:
            d = numpy.dtype(dtype)
        except TypeError:
            d = None
        # Only this machine's byte order: dtype= reads the buffer's bytes as the type.
        if d is not None and d.isnative and d.name in _NAMES:
            return _NAMES[d.name]
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in SIZES.keys():
        return DataType(dtype)
    raise LoomError(INVALID_ARGUMENT, "%s: %r is not a Loom data type (one of %s)"
                    % (arg, dtype, ", ".join(sorted(_NAMES))))


def dtype_of_format(fmt, itemsize, arg):
    """The Loom type of a buffer-protocol format, or LoomError naming arg."""
    code = fmt or "B"
    prefix = code[0] if code[0] in "@=<>!" else ""
    code = code[len(prefix):]
    if (prefix == "<" and sys.byteorder == "big") or (prefix in (">", "!") and sys.byteorder == "little"):
        raise LoomError(INVALID_ARGUMENT, "%s: format %r is not in this machine's byte order" % (arg, fmt))
    if len(code) == 1:
        if code in _FLOATS and SIZES[_FLOATS[code]] == itemsize:
            return _FLOATS[code]
        if code in _SIGNED and itemsize in _INT_BY_SIZE:
            return _INT_BY_SIZE[itemsize][0]
        if code in _UNSIGNED and itemsize in _INT_BY_SIZE:
            return _INT_BY_SIZE[itemsize][1]
    raise LoomError(INVALID_ARGUMENT, "%s: format %r (%d-byte items) has no Loom data type; "
                    "pass dtype= to read the bytes as one" % (arg, fmt, itemsize))


class Pointer:
    """Raw memory: `count` elements of `dtype` at integer `address`, which the
    caller keeps alive for the call. For memory that does not expose the buffer
    protocol (PyTorch tensors: Pointer(t.data_ptr(), t.numel(), "float32"))."""

    __slots__ = ("address", "count", "dtype")

    def __init__(self, address, count, dtype):
        self.dtype = to_dtype(dtype)
        for name, value in (("address", address), ("count", count)):
            v = as_index(value)  # an integer, not a float or None
            if v is None or not 0 <= v < 2**64:
                raise LoomError(INVALID_ARGUMENT, "%s: %r is not an integer in [0, 2**64)"
                                % (name, value))
            setattr(self, name, v)
        if self.count * SIZES[self.dtype] >= 1 << 63:
            raise LoomError(INVALID_ARGUMENT, "count: %d %s elements is more memory than any "
                            "machine has" % (self.count, self.dtype.name.lower()))


# The buffer-protocol format mem_alloc gives each type: one that View reads back as that type,
# or, for types the struct module has no code for, one of their size that View refuses without
# dtype= (so that a bfloat16 buffer is never reduced as integers).
_MEM_FORMATS = {
    DataType.INT8: "b", DataType.UINT8: "B", DataType.INT32: "i", DataType.UINT32: "I",
    DataType.INT64: "q", DataType.UINT64: "Q", DataType.FLOAT16: "e", DataType.FLOAT32: "f",
    DataType.FLOAT64: "d", DataType.BFLOAT16: "H", DataType.FLOAT8_E4M3: "c",
    DataType.FLOAT8_E5M2: "c",
}


def mem_alloc(count, dtype="float32"):
    """`count` elements of `dtype` in memory from loomMemAlloc: shared memory that the ranks
    of a communicator on this host read in place, so that an all-reduce whose input lies there
    skips copying it into Loom's buffers (every page is touched at allocation). Returns a
    writable memoryview of `count` elements, zeroed, whose format gives the type to the
    collectives (bfloat16 and float8 buffers need dtype= there). NumPy and PyTorch take it
    without a copy (numpy.frombuffer, torch.frombuffer). The memory is freed (loomMemFree)
    once neither the view nor anything made from it is left."""
    dt = to_dtype(dtype)
    n = as_index(count)  # NumPy's integers too
    if n is None or n <= 0:
        raise LoomError(INVALID_ARGUMENT, "count: %r is not a positive number of elements"
                        % (count,))
    count = n
    nbytes = count * SIZES[dt]
    if nbytes >= 1 << 63:
        raise LoomError(INVALID_ARGUMENT, "count: %d %s elements is more memory than any machine "
                        "has" % (count, dt.name.lower()))
    from ._lib import load
    from .errors import check

    lib = load()
    ptr = ctypes.c_void_p()
    check(lib.loomMemAlloc(ctypes.byref(ptr), nbytes))
    try:
        raw = (ctypes.c_char * nbytes).from_address(ptr.value)
    except BaseException:
        lib.loomMemFree(ptr)
        raise
    # Every view made from it holds `raw`: the memory goes when the last of them does, and not
    # at exit (arrays that atexit handlers or finalizers still read point into it; the process's
    # end unmaps it, and the library removes its name then).
    weakref.finalize(raw, lib.loomMemFree, ptr.value).atexit = False
    return memoryview(raw).cast("B").cast(_MEM_FORMATS[dt])


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0038

_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_check_buffer = ctypes.pythonapi.PyObject_CheckBuffer
_check_buffer.argtypes = [ctypes.py_object]
_check_buffer.restype = ctypes.c_int


# Calls inside loom.group() run at the group's end, so the buffers they name
# must outlive the calls that queued them: while a group is open on a thread,
# views are kept (with the reference the export holds on each object) and
# released when the outermost group ends.
_group = threading.local()


def group_enter():
    _group.depth = getattr(_group, "depth", 0) + 1
    if _group.depth == 1:
        _group.held = []


def in_group():
    """Whether this thread is inside loom.group() (its calls run at the group's end)."""
    return getattr(_group, "depth", 0) > 0


def group_exit():
    """Ends one level of group; at the outermost, releases the held views."""
    _group.depth -= 1
    if _group.depth == 0:
        held, _group.held = _group.held, []
        for v in held:
            v.release()


class View:
    """One buffer held for the length of a call: address, count and dtype.
    Use as a context manager; the export is released on exit, or at the end of
    the enclosing loom.group()."""

    def __init__(self, obj, arg, writable, dtype=None):
        self.arg = arg
        self._view = None
        if isinstance(obj, Pointer):
            if dtype is not None and to_dtype(dtype) != obj.dtype:
                raise LoomError(INVALID_ARGUMENT, "%s: Pointer holds %s, dtype says %s"
                                % (arg, obj.dtype.name.lower(), to_dtype(dtype).name.lower()))
            if obj.count < 0 or not 0 <= obj.address < 2**64 or (obj.address == 0 and obj.count > 0):
                raise LoomError(INVALID_ARGUMENT, "%s: Pointer with address %#x and count %d"
                                % (arg, obj.address, obj.count))
            self.address, self.count, self.dtype = obj.address, obj.count, obj.dtype
            return
        if obj is None:
            raise LoomError(INVALID_ARGUMENT, "%s: None is not a buffer" % arg)
        if not _check_buffer(obj):
            from . import dlpack  # imports this module: loaded on first use
            if dlpack.exposes(obj):
                # DLPack (PyTorch tensors, ...): borrowed until release, like a view.
                self._view = dlpack.Borrowed(obj, arg, writable, dtype)
                self.address, self.count, self.dtype = (self._view.address, self._view.count,
                                                        self._view.dtype)
                return
        view = _PyBuffer()
        flags = _PyBUF_C_CONTIGUOUS | _PyBUF_FORMAT | (_PyBUF_WRITABLE if writable else 0)
        try:
            _get_buffer(obj, ctypes.byref(view), flags)
        except (BufferError, TypeError, ValueError) as e:
            if writable and _readonly(obj):
                raise LoomError(INVALID_ARGUMENT, "%s: buffer is read-only; Loom writes the "
                                "result into it" % arg) from None
            raise LoomError(INVALID_ARGUMENT, "%s: %s object is not a C-contiguous buffer (%s)"
                            % (arg, type(obj).__name__, e)) from None
        self._view = view
        try:
            fmt = view.format.decode("ascii") if view.format else "B"
            if dtype is not None:
                self.dtype = to_dtype(dtype)
            else:
                self.dtype = dtype_of_format(fmt, view.itemsize, arg)
            size = SIZES[self.dtype]
            if view.len % size:
                raise LoomError(INVALID_ARGUMENT, "%s: %d bytes is not a whole number of %s elements"
                                % (arg, view.len, self.dtype.name.lower()))
            self.address = view.buf or 0
            self.count = view.len // size
        except BaseException:
            self.release()
            raise

    def release(self):
        if isinstance(self._view, _PyBuffer):
            _release_buffer(ctypes.byref(self._view))
        elif self._view is not None:
            self._view.release()
        self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if getattr(_group, "depth", 0) > 0 and self._view is not None:
            _group.held.append(self)
        else:
            self.release()


def _readonly(obj):
    try:
        return memoryview(obj).readonly
    except (TypeError, ValueError):  # no buffer, or one released or of a format memoryview refuses
        return False
