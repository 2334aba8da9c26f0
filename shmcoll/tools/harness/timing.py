"""Timing between live ranks: the loops every measurement of shmcoll uses."""
import os
import time

import numpy as np


def size_sweep(minbytes, maxbytes, factor):
    """minbytes, minbytes x factor, ... up to maxbytes (each size at least one more)."""
    if minbytes < 0 or maxbytes < minbytes:
        raise ValueError(f"need 0 <= MIN <= MAX, got {minbytes} and {maxbytes}")
    if factor <= 1 and minbytes != maxbytes:
        raise ValueError(f"step factor must be > 1, got {factor}")
    sizes, s = [], minbytes
    while True:
        sizes.append(s)
        nxt = max(int(s * factor), s + 1)
        if nxt > maxbytes or factor <= 1:
            return sizes
        s = nxt


def auto_iters(nbytes):
    """About 0.1-0.2 s of traffic per size, bounded to [5, 2000] calls."""
    return max(5, min(2000, int(5e7 // max(nbytes, 1))))


def time_calls(comm, call, iters, warmup):
    """Seconds per call: the max over ranks of each rank's mean over `iters` calls.

    Every rank must call this with the same iters/warmup; it synchronises the ranks
    with a barrier before the timed loop, and gathers the per-rank means after it.
    """
    for _ in range(warmup):
        call()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    comm.synchronize()      # device arrays: until the GPU has finished them
    mean = (time.perf_counter() - t0) / max(iters, 1)
    return float(comm.allgather(np.array([mean]))[:, 0].max())


def median_call_seconds(call, calls):
    """Median seconds of `calls` calls, each timed on its own (rank 0's view)."""
    samples = []
    for _ in range(calls):      # exactly `calls`: the other ranks repeat as many
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) if samples else 0.0


def copy_reference_seconds(nbytes, budget=0.02):
    """Median seconds of one memcpy of `nbytes` on this core, measured now.

    Benchmarks divide by it: a slower or busier machine slows the copy and the
    collective alike, so the ratio drifts less between runs than either time.
    """
    src = np.ones(max(nbytes, 8), np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    calls = max(1, min(10000, int(budget * 5e9 / max(nbytes, 1) / 7)))
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            np.copyto(dst, src)
        samples.append((time.perf_counter() - t0) / calls)
    return float(np.median(samples))


def pin(rank):
    """Rank r runs on the r-th usable CPU (mod their number), on both sides of a
    comparison alike: left to itself the scheduler may keep one job's ranks on one
    core for seconds (a waker pulls its wakee close), which would slow that job alone."""
    from shmcoll._core.topology import allowed_cpus
    cpus = allowed_cpus()
    try:
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    except (AttributeError, OSError):
        pass
