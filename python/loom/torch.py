"""The "loom" torch.distributed backend, for CPU tensors (torch 2.x).

    import loom.torch                   # registers the backend
    torch.distributed.init_process_group("loom", rank=r, world_size=n, init_method=...)
    # or backend="cpu:loom" beside another backend for other devices

The backend is C++ (python/torch_ext, a c10d::Backend over libloom's C API, built
by the project's CMake into <build>/python/ where torch is found): every
collective is queued on a non-blocking Loom communicator and returns its Work
at once; Loom's own thread moves the bytes; the Work completes when its own
operation does. Rank 0 makes Loom's unique id and shares it through the store
torch gives the backend.

The module is looked for at $LOOM_TORCH_EXTENSION (a file), else beside the
libloom.so.0 that the loom package loads (a build tree), else on sys.path.
"""

import atexit
import glob
import importlib.machinery
import importlib.util
import os
import sys

import torch.distributed as dist

from . import _lib
from .errors import LoomError, SYSTEM_ERROR


def _load_extension():
    name = "_loom_torch"
    if name in sys.modules:
        return sys.modules[name]
    lib = _lib.load()  # libloom first, so the extension binds to the same copy
    paths = []
    env = os.environ.get("LOOM_TORCH_EXTENSION")
    if env:
        paths.append(env)
    else:
        build = os.path.dirname(os.path.realpath(lib._name)) if os.sep in lib._name else None
        if build:
            paths.extend(glob.glob(os.path.join(build, "python", name + "*.so")))
    for path in paths:
        spec = importlib.util.spec_from_file_location(
            name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
        return module
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise LoomError(SYSTEM_ERROR, "LOOM_TORCH_EXTENSION: the torch backend's module %s is not "
                        "built (looked in %s and on sys.path: %s); build with scripts/build.sh "
                        "after scripts/setup.sh" % (name, paths or "nowhere", e)) from None


_ext = _load_extension()
# A backend whose last reference went in a future's callback was ended on one of its own
# threads, which finishes after that callback: joined here, before the interpreter finalises.
atexit.register(_ext.join_stopped_threads)


def _create(store, rank, size, timeout):
    return _ext.create_backend(store, rank, size, timeout)


def register():
    """Registers the "loom" backend for CPU tensors with torch.distributed (once)."""
    if "loom" not in dist.Backend.backend_list:
        dist.Backend.register_backend("loom", _create, devices=["cpu"])


register()
