"""Runs a function on N forked ranks of one Loom communicator and returns what
each rank returned. Rank 0 makes the unique id and passes it through a queue,
so the test process itself never starts a rendezvous before forking."""

import multiprocessing
import traceback

import loom

_ctx = multiprocessing.get_context("fork")


def _child(rank, n, fn, args, uid_q, out_q):
    try:
        if rank == 0:
            uid = loom.unique_id()
            for _ in range(n - 1):
                uid_q.put(uid)
        else:
            uid = uid_q.get(timeout=60)
        comm = loom.Communicator(rank, n, uid, timeout_ms=60000, name="pytest")
        try:
            result = fn(comm, rank, n, *args)
        finally:
            comm.destroy()
        out_q.put((rank, True, result))
    except BaseException:  # reported to the parent, which fails the test
        out_q.put((rank, False, traceback.format_exc()))


def run_ranks(n, fn, *args, timeout=180):
    """fn(comm, rank, n, *args) on n processes; returns [result of rank 0, ...].
    Raises AssertionError with the rank's traceback when a rank fails."""
    uid_q, out_q = _ctx.Queue(), _ctx.Queue()
    procs = [_ctx.Process(target=_child, args=(r, n, fn, args, uid_q, out_q)) for r in range(n)]
    for p in procs:
        p.start()
    results, errors = {}, []
    try:
        for _ in range(n):
            rank, ok, value = out_q.get(timeout=timeout)
            (results.__setitem__(rank, value) if ok else errors.append("rank %d:\n%s" % (rank, value)))
    except Exception as e:  # queue.Empty: a rank hung or died without a word
        errors.append("ranks did not all report within %d s (%r)" % (timeout, e))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(n)]


def run_process(fn, *args, timeout=120):
    """fn(*args) in one forked process (no communicator); returns its result."""
    out_q = _ctx.Queue()

    def body():
        try:
            out_q.put((True, fn(*args)))
        except BaseException:
            out_q.put((False, traceback.format_exc()))

    p = _ctx.Process(target=body)
    p.start()
    try:
        ok, value = out_q.get(timeout=timeout)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
    if not ok:
        raise AssertionError(value)
    return value
