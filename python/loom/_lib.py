"""Finds and loads libloom.so.0 and declares the C functions the package calls.

The library is looked for, in order, at $LOOM_LIBRARY (a file), in the build
trees of the source checkout this package sits in (<repo>/build*/), and by the
system loader (an installed libloom.so.0 on the loader's path).
"""

import ctypes
import glob
import os

_lib = None

c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p

UNIQUE_ID_BYTES = 128


class UniqueIdStruct(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class ConfigStruct(ctypes.Structure):
    """loomConfig_t, field for field."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", c_int),
        ("commName", c_char_p),
        ("timeoutMs", c_int),
    ]


CONFIG_MAGIC = 0x4C4F4F4D
CONFIG_UNDEF_INT = -2147483648

# name: (result type, argument types)
_PROTOTYPES = {
    "loomGetVersion": (c_int, [ctypes.POINTER(c_int)]),
    "loomGetUniqueId": (c_int, [ctypes.POINTER(UniqueIdStruct)]),
    "loomCommInitRankConfig": (
        c_int, [ctypes.POINTER(c_void_p), c_int, UniqueIdStruct, c_int, ctypes.POINTER(ConfigStruct)]),
    "loomCommInitFromEnv": (c_int, [ctypes.POINTER(c_void_p), ctypes.POINTER(ConfigStruct)]),
    "loomCommSplit": (
        c_int, [c_void_p, c_int, c_int, ctypes.POINTER(c_void_p), ctypes.POINTER(ConfigStruct)]),
    "loomCommFinalize": (c_int, [c_void_p]),
    "loomCommDestroy": (c_int, [c_void_p]),
    "loomCommAbort": (c_int, [c_void_p]),
    "loomCommGetAsyncError": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "loomCommCount": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "loomCommCuDevice": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "loomCommUserRank": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "loomGetErrorString": (c_char_p, [c_int]),
    "loomGetLastError": (c_char_p, [c_void_p]),
    "loomRedOpCreatePreMulSum": (c_int, [ctypes.POINTER(c_int), c_void_p, c_int, c_int, c_void_p]),
    "loomRedOpDestroy": (c_int, [c_int, c_void_p]),
    "loomAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomBroadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p]),
    "loomAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p]),
    "loomReduceScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomAllToAll": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p]),
    "loomAllToAllv": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int,
                              c_void_p, c_void_p]),
    "loomGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomSend": (c_int, [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomRecv": (c_int, [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "loomSendTagged": (c_int, [c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p]),
    "loomRecvTagged": (c_int, [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.POINTER(c_int),
                               c_void_p, c_void_p]),
    "loomBarrier": (c_int, [c_void_p, c_void_p]),
    "loomCommDumpTrace": (c_int, [c_void_p, c_char_p]),
    "loomCommSetOpTag": (c_int, [c_void_p, ctypes.c_uint64]),
    "loomMemAlloc": (c_int, [ctypes.POINTER(c_void_p), c_size_t]),
    "loomMemFree": (c_int, [c_void_p]),
    "loomGroupStart": (c_int, []),
    "loomGroupEnd": (c_int, []),
}


def _instrumented(build_dir):
    """Whether a build tree's name says it is a sanitizer or fuzzing build."""
    return any(tag in build_dir for tag in ("asan", "tsan", "ubsan", "msan", "sanitize", "fuzz"))


def candidates():
    """The paths tried, in order (for error messages and tests)."""
    out = []
    env = os.environ.get("LOOM_LIBRARY")
    if env:
        return [env]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.isfile(os.path.join(repo, "include", "loom", "loom.h")):
        # Newest build first, so a fresh build wins over a stale one; sanitizer builds
        # (build-asan, build-tsan, ...) only when LOOM_LIBRARY names them, since their
        # runtime must come first in the process.
        found = [p for p in glob.glob(os.path.join(repo, "build*", "libloom.so.0"))
                 if not _instrumented(os.path.basename(os.path.dirname(p)))]
        out.extend(sorted(found, key=os.path.getmtime, reverse=True))
    out.append("libloom.so.0")  # the system loader's search path
    return out


def load():
    """Returns the loaded library, loading it on first use."""
    global _lib
    if _lib is not None:
        return _lib
    from .errors import LoomError, SYSTEM_ERROR

    tried = []
    explicit = "LOOM_LIBRARY" in os.environ and os.environ["LOOM_LIBRARY"]
    for path in candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            if explicit:
                break
            continue
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _lib = lib
        return lib
    raise LoomError(SYSTEM_ERROR, "LOOM_LIBRARY: cannot load libloom.so.0; tried " + "; ".join(tried))
