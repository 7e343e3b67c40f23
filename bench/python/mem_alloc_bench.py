"""loom.mem_alloc against ordinary buffers, from Python: the all-reduce's time per call on
2 and 4 forked local ranks, with the input and output in plain array.array memory and in
loom.mem_alloc memory (which the peers read in place), alternating, best of the repetitions
(each repetition's time is its slowest rank's). Prints one line per rank count and size with
the ratio plain/mem_alloc (above 1: mem_alloc is faster).

usage: PYTHONPATH=python:tests/python LOOM_LIBRARY=build/libloom.so.0 \\
           python3 bench/python/mem_alloc_bench.py [--quick]
--quick: one small size, two repetitions (a smoke run, as ctest runs it).
"""

import array
import sys
import time

import loom
from ranks import run_ranks  # tests/python/ranks.py: forked ranks of one communicator


def body(comm, rank, n, count, iters, reps):
    times = {"plain": [], "mem_alloc": []}
    plain = (array.array("f", [1.0] * count), array.array("f", [0.0] * count))
    shared = (loom.mem_alloc(count, "float32"), loom.mem_alloc(count, "float32"))
    shared[0][:] = plain[0]
    for _ in range(reps):
        for name, (send, recv) in (("plain", plain), ("mem_alloc", shared)):
            for _ in range(3):  # warm-up
                comm.all_reduce(send, recv)
            comm.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(send, recv)
            times[name].append((time.perf_counter() - t) / iters * 1e6)
        for name, (_, recv) in (("plain", plain), ("mem_alloc", shared)):
            if list(recv[:4]) != [float(n)] * 4:
                raise AssertionError("rank %d, %s: wrong sum %s" % (rank, name, list(recv[:4])))
    return times


def main():
    quick = "--quick" in sys.argv[1:]
    sizes = (1 << 15,) if quick else (1 << 17, 1 << 19, 1 << 21)  # float32 elements
    reps = 2 if quick else 5
    for n in (2, 4):
        for count in sizes:
            iters = max(5 if quick else 20, (1 << 28) // (count * 4 * n))
            res = run_ranks(n, body, count, iters, reps)
            best = {k: min(max(r[k][i] for r in res) for i in range(reps))
                    for k in ("plain", "mem_alloc")}
            print("mem_alloc_bench: ranks %d bytes %d plain %.1f us mem_alloc %.1f us ratio %.2f"
                  % (n, count * 4, best["plain"], best["mem_alloc"],
                     best["plain"] / best["mem_alloc"]))


if __name__ == "__main__":
    main()
