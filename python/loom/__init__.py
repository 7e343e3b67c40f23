"""Loom from Python: communicators and collectives over libloom's C API.

    import loom
    uid = loom.unique_id()                      # on one rank; send the bytes to all
    comm = loom.Communicator(rank, world, uid)  # or loom.Communicator.from_env()
    comm.all_reduce(array_or_bytearray)         # in place, sum

Pure Python over ctypes: no compiled extension. libloom.so.0 is found at
$LOOM_LIBRARY, then in the source checkout's build trees, then by the loader.
Buffers are anything with the buffer protocol (bytearray, array.array,
memoryview, NumPy arrays), anything that exposes DLPack on the CPU (PyTorch
tensors, ...), or a loom.Pointer; failures raise loom.LoomError
with Loom's message, which names the argument at fault.
"""

from .buffers import DataType, Pointer, mem_alloc
from .comm import Communicator, PreMulSum, ReduceOp, group, unique_id, version
from .errors import LoomError

__all__ = ["Communicator", "DataType", "LoomError", "Pointer", "PreMulSum", "ReduceOp", "group",
           "mem_alloc", "unique_id", "version"]
