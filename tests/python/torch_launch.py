"""The parent's side of the PyTorch backend tests: starts one real process per rank
(tests/python/torch_worker.py), each joining a process group through a file:// init
method in a fresh temporary folder, bounds every wait, and returns what each rank wrote.

    launch(backend, mode, world, **kw) -> [rank 0's JSON result, rank 1's, ...]

Only torch_missing() imports torch (in this process); the ranks import it themselves."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
ROOT = os.path.dirname(os.path.dirname(HERE))


def torch_missing():
    """Why these tests cannot run here (None: they can). They use torch 2.x's APIs (FSDP2,
    DTensor, functional collectives); torch 2.13 is the version they were written for."""
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError as e:
        return "torch not installed (%s)" % e
    major_minor = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if major_minor < (2, 6):
        return "torch %s is too old (2.6 or later: FSDP2, DTensor)" % torch.__version__
    return None


def have_loom_backend():
    """Whether python/loom/torch.py (the torch 2.x backend) is there to import."""
    import importlib.util
    try:
        return importlib.util.find_spec("loom.torch") is not None
    except Exception:  # noqa: BLE001  loom itself missing or its library not loadable
        return False


def loom_trace_tool():
    """build*/tools/trace/loom-trace (or build*/loom-trace) next to the library in use, else None."""
    lib = os.environ.get("LOOM_LIBRARY", "")
    dirs = [os.path.dirname(os.path.abspath(lib))] if lib else []
    dirs += sorted((os.path.join(ROOT, d) for d in os.listdir(ROOT) if d.startswith("build")),
                   key=lambda p: -os.path.getmtime(p))
    for d in dirs:
        for rel in ("tools/trace/loom-trace", "loom-trace"):
            p = os.path.join(d, rel)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    return None


def loom_shm_names():
    """Names in /dev/shm that Loom made (communicator segments /loom-<hash>-<rank>,
    loom.mem_alloc's /loom-mem-*)."""
    try:
        return {n for n in os.listdir("/dev/shm") if "loom" in n.lower()}
    except OSError:
        return set()


class RankFailure(AssertionError):
    pass


def _env(extra):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("LOOM_TRACE_DIR", None)
    path = [p for p in env.get("PYTHONPATH", "").split(":") if p] + [os.path.join(ROOT, "python"), HERE]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(path))
    env.update(extra or {})
    return env


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def launch(backend, mode, world, timeout=120, env=None, args=(), expect_exit=None, grace=10):
    """Runs torch_worker.py BACKEND RANK WORLD DIR MODE ARGS... on `world` processes.

    A rank must exit 0 unless expect_exit[rank] says otherwise (None: any code). Every
    rank must exit within `timeout` seconds (all together), and within `grace` seconds
    of a rank's unexpected exit; else the rest are killed. RankFailure then carries the
    failed rank's output (or every rank's, when some hung). Returns the list of results
    the ranks wrote (None for a rank that wrote none)."""
    d = tempfile.mkdtemp(prefix="loom_torch_")
    logs = [os.path.join(d, "log%d.txt" % r) for r in range(world)]
    procs = []

    def unexpected(r):
        want = 0 if expect_exit is None else expect_exit.get(r, 0)
        code = procs[r].poll()
        return code is not None and want is not None and code != want

    def log(r):
        with open(logs[r], errors="replace") as f:
            return f.read()[-6000:]
    try:
        for r in range(world):
            with open(logs[r], "w") as f:
                procs.append(subprocess.Popen(
                    [sys.executable, WORKER, backend, str(r), str(world), d, mode]
                    + [str(a) for a in args],
                    env=_env(env), stdout=f, stderr=subprocess.STDOUT, cwd=d, start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(unexpected(r) for r in range(world)):
                deadline = min(deadline, time.monotonic() + grace)
            time.sleep(0.05)
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
        if hung:  # the worker's faulthandler writes every thread's Python stack to its log
            for r in hung:
                try:
                    os.kill(procs[r].pid, signal.SIGUSR2)
                except ProcessLookupError:
                    pass
            time.sleep(1)
        _kill_all(procs)
        bad = [r for r in range(world) if r not in hung and unexpected(r)]
        if bad:
            raise RankFailure("%s %s world %d: rank %d exited %s%s:\n%s" % (
                backend, mode, world, bad[0], procs[bad[0]].returncode,
                " (ranks %s then killed)" % hung if hung else "", log(bad[0])))
        if hung:
            raise RankFailure("%s %s world %d: ranks %s still running after %d s (killed):\n%s" % (
                backend, mode, world, hung, timeout,
                "\n".join("--- rank %d ---\n%s" % (r, log(r)) for r in range(world))))
        out = []
        for r in range(world):
            path = os.path.join(d, "out%d.json" % r)
            if os.path.exists(path):
                with open(path) as f:
                    out.append(json.load(f))
            else:
                out.append(None)
        return out
    finally:
        _kill_all(procs)
        shutil.rmtree(d, ignore_errors=True)
