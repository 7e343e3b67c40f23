"""Reads CPU memory out of any object that exposes DLPack (`__dlpack__` and
`__dlpack_device__`): PyTorch tensors, NumPy arrays, JAX/CuPy-style arrays on
the host, ...

Loom asks for DLPack 1.0 first (`__dlpack__(max_version=(1, 0))`): a PyCapsule
named "dltensor_versioned" holding a DLManagedTensorVersioned, whose flags say
when the memory is read-only (refused where Loom writes, taken where it only
reads) or a copy (refused where Loom writes: the result would not reach the
caller's memory). A producer that does not take max_version gives the earlier
form, a "dltensor" capsule holding a DLManagedTensor. Loom only borrows either
for the length of one call: the capsule keeps its name (it is not consumed) and
its deleter is left to the capsule's own destructor, which runs when the last
reference goes, after the call. The producer object is referenced as well, so
neither can go away mid-call.
"""

import ctypes

from .errors import LoomError, INVALID_ARGUMENT
from .buffers import DataType, SIZES, to_dtype

# DLDeviceType: Loom reads kDLCPU; the others are named in errors.
KDL_CPU = 1
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda host", 4: "opencl", 7: "vulkan", 8: "metal",
             9: "vpi", 10: "rocm", 11: "rocm host", 13: "cuda managed", 14: "oneapi"}

# DLDataTypeCode values.
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT = 0, 1, 2, 4

_DTYPES = {
    (_KDL_INT, 8): DataType.INT8, (_KDL_UINT, 8): DataType.UINT8,
    (_KDL_INT, 32): DataType.INT32, (_KDL_UINT, 32): DataType.UINT32,
    (_KDL_INT, 64): DataType.INT64, (_KDL_UINT, 64): DataType.UINT64,
    (_KDL_FLOAT, 16): DataType.FLOAT16, (_KDL_FLOAT, 32): DataType.FLOAT32,
    (_KDL_FLOAT, 64): DataType.FLOAT64, (_KDL_BFLOAT, 16): DataType.BFLOAT16,
}
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex",
               6: "bool"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_FLAG_READ_ONLY, _FLAG_IS_COPIED = 1 << 0, 1 << 1
_CAPSULE_NAME = b"dltensor"
_VERSIONED_NAME = b"dltensor_versioned"
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid.restype = ctypes.c_int
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer.restype = ctypes.c_void_p


def exposes(obj):
    """True for objects that offer DLPack."""
    return hasattr(obj, "__dlpack__")


def _device_name(device_type):
    return _DEVICE_NAMES.get(device_type, "device type %d" % device_type)


class Borrowed:
    """One DLPack export held for the length of a call: address, count, dtype.
    Holds the producer and its capsule until release()."""

    def __init__(self, obj, arg, writable, dtype=None):
        self.arg = arg
        kind = type(obj).__name__
        # Ask where the memory is before exporting, so no device export is made.
        dev = getattr(obj, "__dlpack_device__", None)
        if dev is not None:
            try:
                device_type, device_id = (int(x) for x in dev())
            except Exception as e:
                raise LoomError(INVALID_ARGUMENT, "%s: %s.__dlpack_device__() failed (%s)"
                                % (arg, kind, e)) from None
            if device_type != KDL_CPU:
                raise LoomError(INVALID_ARGUMENT, "%s: %s is on %s:%d; Loom reads host (CPU) "
                                "memory only" % (arg, kind, _device_name(device_type), device_id))
        try:
            try:
                capsule = obj.__dlpack__(max_version=(1, 0))
            except TypeError:  # a producer from before DLPack 1.0: no max_version
                capsule = obj.__dlpack__()
        except Exception as e:
            raise LoomError(INVALID_ARGUMENT, "%s: %s.__dlpack__() failed (%s: %s)"
                            % (arg, kind, type(e).__name__, e)) from None
        versioned = bool(_is_valid(capsule, _VERSIONED_NAME))
        if not versioned and not _is_valid(capsule, _CAPSULE_NAME):
            raise LoomError(INVALID_ARGUMENT, "%s: %s.__dlpack__() did not return an unconsumed "
                            "\"dltensor\" or \"dltensor_versioned\" capsule" % (arg, kind))
        self._producer, self._capsule = obj, capsule
        try:
            if versioned:
                managed = _DLManagedTensorVersioned.from_address(
                    _get_pointer(capsule, _VERSIONED_NAME))
                self._check_versioned(managed, kind, writable)
            else:
                managed = _DLManagedTensor.from_address(_get_pointer(capsule, _CAPSULE_NAME))
            self._read(managed.dl_tensor, kind, dtype)
        except BaseException:
            self.release()
            raise

    def _check_versioned(self, managed, kind, writable):
        arg, version = self.arg, managed.version
        if version.major != 1:  # a later major version may lay the tensor out otherwise
            raise LoomError(INVALID_ARGUMENT, "%s: %s exported DLPack %d.%d; Loom reads 1.x"
                            % (arg, kind, version.major, version.minor))
        if writable and managed.flags & _FLAG_READ_ONLY:
            raise LoomError(INVALID_ARGUMENT, "%s: %s is read-only (DLPack); Loom writes the "
                            "result into it" % (arg, kind))
        if writable and managed.flags & _FLAG_IS_COPIED:
            raise LoomError(INVALID_ARGUMENT, "%s: %s exported a copy (DLPack); Loom's result "
                            "would not reach its memory" % (arg, kind))

    def _read(self, t, kind, dtype):
        arg = self.arg
        if t.device.device_type != KDL_CPU:
            raise LoomError(INVALID_ARGUMENT, "%s: %s is on %s:%d; Loom reads host (CPU) memory "
                            "only" % (arg, kind, _device_name(t.device.device_type),
                                      t.device.device_id))
        code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
        own = _DTYPES.get((code, bits)) if lanes == 1 else None
        if dtype is None and own is None:
            raise LoomError(INVALID_ARGUMENT, "%s: DLPack type %s%d%s has no Loom data type; pass "
                            "dtype= to read the bytes as one"
                            % (arg, _CODE_NAMES.get(code, "code %d " % code), bits,
                               "x%d" % lanes if lanes != 1 else ""))
        if not 0 <= t.ndim <= 64:  # more dimensions than any producer makes: a corrupt tensor
            raise LoomError(INVALID_ARGUMENT, "%s: DLPack ndim %d" % (arg, t.ndim))
        shape = [t.shape[i] for i in range(t.ndim)]
        if any(s < 0 for s in shape):
            raise LoomError(INVALID_ARGUMENT, "%s: DLPack shape %s" % (arg, shape))
        items = 1
        for s in shape:
            items *= s
        if t.strides and items > 0:
            want = 1
            for i in reversed(range(t.ndim)):
                # A dimension of extent 1 may carry any stride.
                if shape[i] != 1 and t.strides[i] != want:
                    raise LoomError(INVALID_ARGUMENT, "%s: %s is not contiguous (shape %s, "
                                    "strides %s elements); pass a contiguous copy"
                                    % (arg, kind, tuple(shape),
                                       tuple(t.strides[j] for j in range(t.ndim))))
                want *= shape[i]
        nbytes = items * ((bits * lanes + 7) // 8)
        if nbytes >= 1 << 63:
            raise LoomError(INVALID_ARGUMENT, "%s: DLPack shape %s is %d bytes, more than memory"
                            % (arg, shape, nbytes))
        self.dtype = own
        if dtype is not None:
            self.dtype = to_dtype(dtype)
        size = SIZES[self.dtype]
        if nbytes % size:
            raise LoomError(INVALID_ARGUMENT, "%s: %d bytes is not a whole number of %s elements"
                            % (arg, nbytes, self.dtype.name.lower()))
        if items > 0 and not t.data:
            raise LoomError(INVALID_ARGUMENT, "%s: DLPack data pointer is NULL" % arg)
        self.address = (t.data or 0) + t.byte_offset
        self.count = nbytes // size

    def release(self):
        # Dropping the capsule runs its destructor, which calls the producer's deleter.
        self._capsule = None
        self._producer = None
