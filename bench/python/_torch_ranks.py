"""Shared helpers of the torch benchmarks in bench/python: local process groups started from a
forkserver that has torch loaded, the gloo/loom alternation, the command line they share and
markdown tables.

A rank function fn(rank, nprocs, *args) runs inside an initialised default process group
(file:// rendezvous in a fresh temporary directory, torch.set_num_threads(1)) and returns a
picklable result; run_ranks returns the results in rank order, or raises RankFailure when a
rank raises, dies, or the whole set outlives its time limit (every rank is then killed).
"""

import argparse
import datetime
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("gloo", "loom")


class RankFailure(RuntimeError):
    pass


def setup_env():
    """Points the loom package at this checkout (LOOM_LIBRARY, PYTHONPATH, sys.path) unless the
    caller already did, and pins gloo to loopback. Runs before the forkserver starts, which
    inherits the environment and sys.path."""
    os.environ.setdefault("LOOM_LIBRARY", str(REPO / "build" / "libloom.so.0"))
    py = str(REPO / "python")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if py not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([py] + paths)
    if py not in sys.path:
        sys.path.insert(1, py)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def loom_unavailable():
    """None when `import loom.torch` registers the "loom" backend here, else why not."""
    lib = Path(os.environ["LOOM_LIBRARY"])
    if not lib.exists():
        return "%s does not exist" % lib
    try:
        importlib.import_module("loom.torch")
    except Exception as e:  # an absent module or a broken import both mean: no loom runs
        return "import loom.torch failed: %s: %s" % (type(e).__name__, e)
    import torch.distributed as dist
    if not hasattr(dist.Backend, "LOOM"):
        return "import loom.torch did not register a backend named loom"
    return None


def parser(description, nprocs="2"):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backends", default=None,
                   help="comma list of gloo,loom (default both; loom is left out with a "
                        "warning when it cannot be imported)")
    p.add_argument("-np", "--nprocs", default=nprocs,
                   help="comma list of local process counts (default %s)" % nprocs)
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions; each starts every backend's process set once, "
                        "alternating; the best repetition is kept")
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one process set may take before all its ranks are killed "
                        "(default 600, 180 with --quick)")
    return p


def backends_of(args):
    """The backends to run, in order; exits 1 when one named explicitly cannot run. Also sets
    the environment up and fills in --timeout's default."""
    setup_env()
    if args.timeout is None:
        args.timeout = 180.0 if args.quick else 600.0
    names = args.backends.split(",") if args.backends else list(BACKENDS)
    for b in names:
        if b not in BACKENDS:
            sys.exit("unknown backend %r (expected some of %s)" % (b, ",".join(BACKENDS)))
    if "loom" in names:
        why = loom_unavailable()
        if why is not None:
            if args.backends:
                sys.exit("loom backend unavailable: " + why)
            print("note: loom backend unavailable (%s); running gloo only" % why,
                  file=sys.stderr)
            names.remove("loom")
    return names


def nprocs_of(args):
    return [int(n) for n in str(args.nprocs).split(",")]


def _watchdog(parent, deadline):
    """Ends this rank when its benchmark process is gone or its time is up, so that no rank
    outlives the run even when the parent was killed."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(125)
        if time.monotonic() > deadline:
            os._exit(124)


def _rank_main(fn, rank, nprocs, backend, init_method, args, conn, timeout, parent):
    threading.Thread(target=_watchdog, args=(parent, time.monotonic() + timeout + 10),
                     daemon=True).start()
    faulthandler.enable()  # a crash prints each thread's Python stack
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if backend == "loom":
            importlib.import_module("loom.torch")
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=nprocs, timeout=datetime.timedelta(seconds=timeout))
        result = fn(rank, nprocs, *args)
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    dist.destroy_process_group()


_CTX = None


def _context():
    """A forkserver that has imported torch, so that each rank starts in well under a second."""
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch.nn"])
    return _CTX


def run_ranks(fn, nprocs, backend, args=(), timeout=600.0):
    """Runs fn on nprocs local ranks of one `backend` process group; results in rank order."""
    ctx = _context()
    deadline = time.monotonic() + timeout
    procs, conns = [], []
    with tempfile.TemporaryDirectory(prefix="loom-torch-bench-") as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        try:
            for rank in range(nprocs):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_rank_main, daemon=True, name="%s-rank%d" % (backend, rank),
                                args=(fn, rank, nprocs, backend, init_method, args, send,
                                      timeout, os.getpid()))
                p.start()
                send.close()
                procs.append(p)
                conns.append(recv)
            results = _collect(procs, conns, backend, deadline)
            for p in procs:  # a rank that returned its result but hangs in shutdown fails too
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    raise RankFailure("%s: %s did not exit after returning its result "
                                      "(destroy_process_group hung?)" % (backend, p.name))
            return results
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(5)
            for c in conns:
                c.close()


def _collect(procs, conns, backend, deadline):
    results = [None] * len(procs)
    pending = dict(enumerate(conns))
    while pending:
        left = deadline - time.monotonic()
        ready = multiprocessing.connection.wait(list(pending.values()), timeout=max(0.0, left))
        if not ready:
            raise RankFailure("%s: ranks %s did not finish in time; killed"
                              % (backend, sorted(pending)))
        for rank, c in list(pending.items()):
            if c not in ready:
                continue
            del pending[rank]
            try:
                status, value = c.recv()
            except EOFError:
                procs[rank].join(5)
                code = procs[rank].exitcode
                raise RankFailure("%s: rank %d died (%s)" % (backend, rank, (
                    "killed by signal %d" % -code if code is not None and code < 0 else
                    "exit code 255: its status was lost, the forkserver may be gone"
                    if code == 255 else "exit code %s" % code)))
            if status != "ok":
                raise RankFailure("%s: rank %d failed:\n%s" % (backend, rank, value))
            results[rank] = value
    return results


def alternate(backends, reps, fn, nprocs, args=(), timeout=600.0, log=None):
    """{backend: [per-rep list of rank results]}, running the backends' process sets in turn
    within each repetition."""
    out = {b: [] for b in backends}
    for rep in range(reps):
        for b in backends:
            t = time.monotonic()
            out[b].append(run_ranks(fn, nprocs, b, args, timeout))
            if log:
                log("  rep %d/%d %s np=%d: %.1f s" % (rep + 1, reps, b, nprocs,
                                                      time.monotonic() - t))
    return out


def stderr_log(msg):
    print(msg, file=sys.stderr, flush=True)


def block_median(fn, iters, blocks):
    """Median over `blocks` timed blocks of the mean seconds per call of fn() (iters calls)."""
    per_call = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        per_call.append((time.perf_counter() - t) / iters)
    return statistics.median(per_call)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return statistics.geometric_mean(xs) if xs else float("nan")


def fmt_bytes(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def fmt(x, digits=1):
    if x is None or x != x:
        return "-"
    return "%.*f" % (digits, x)


def print_table(headers, rows):
    """A markdown table with columns padded to their widest cell."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
    print(line(headers))
    print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    for r in cells:
        print(line(r))
    sys.stdout.flush()
