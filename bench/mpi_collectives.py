"""The MPI libraries' Broadcast, AllGather, ReduceScatter and AllReduce, timed with
`shmcoll perf`'s conventions so that the two print comparable rows.

    mpirun -np 4 <python with mpi4py> bench/mpi_collectives.py --label openmpi
    python -m shmcoll perf broadcast -np 4 -b 8 -e 4M -f 8      # the same sizes

Sizes as in `shmcoll perf`: broadcast and allreduce the bytes of x, allgather the
gathered output, reduce_scatter x on each rank (P blocks); float32, sum; Broadcast from
root 0; time is the max over ranks of the mean per call (nccl-tests).  One JSON line
per (collective, size) from rank 0.  Runs in any Python with mpi4py and numpy (it does
not import shmcoll).
"""
import argparse
import json
import time

import numpy as np

DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M"
COLLECTIVES = ("broadcast", "allgather", "reduce_scatter", "allreduce")


def parse_size(text):
    """shmcoll._core.sizes.parse_size's notation."""
    text = text.strip().upper()
    for suffix, scale in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * scale)
    return int(text)


def iters_for(comm, MPI, call):
    """About 0.2 s of calls, 5 to 2000 of them (a library that collapses when ranks
    outnumber cores takes milliseconds per call)."""
    t0 = time.perf_counter()
    for _ in range(3):
        call()
    once = comm.allreduce((time.perf_counter() - t0) / 3, op=MPI.MAX)
    return int(max(5, min(2000, 0.2 / max(once, 1e-7))))


def library(MPI):
    version = MPI.Get_library_version()
    for name in ("Open MPI", "MPICH", "Intel", "MVAPICH"):
        if version.startswith(name):
            return name.replace(" ", "").lower()
    return version.split()[0].lower()


def call_for(comm, MPI, collective, nbytes):
    """(call, check, size): one call of `collective` for `nbytes`, whether its last
    result is right, and its size as perf counts it (at least one float per block)."""
    P, rank = comm.Get_size(), comm.Get_rank()
    if collective == "broadcast":
        x = np.full(max(1, nbytes // 4), rank, np.float32)
        return (lambda: comm.Bcast(x, root=0)), (lambda: bool(np.all(x == 0))), x.nbytes
    if collective == "allreduce":
        x = np.full(max(1, nbytes // 4), rank + 1, np.float32)
        y = np.empty_like(x)
        return ((lambda: comm.Allreduce(x, y, op=MPI.SUM)),
                (lambda: bool(np.all(y == P * (P + 1) / 2))), x.nbytes)
    block = max(1, nbytes // 4 // P)
    if collective == "allgather":
        x = np.full(block, rank, np.float32)
        y = np.empty(block * P, np.float32)
        want = np.repeat(np.arange(P, dtype=np.float32), block)
        return (lambda: comm.Allgather(x, y)), (lambda: bool(np.array_equal(y, want))), y.nbytes
    x = np.full(block * P, rank + 1, np.float32)
    y = np.empty(block, np.float32)
    return ((lambda: comm.Reduce_scatter_block(x, y, op=MPI.SUM)),
            (lambda: bool(np.all(y == P * (P + 1) / 2))), x.nbytes)


def main():
    from mpi4py import MPI
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--collectives", nargs="+", default=list(COLLECTIVES), choices=COLLECTIVES)
    p.add_argument("--label", default=None)
    opts = p.parse_args()
    comm = MPI.COMM_WORLD
    label = opts.label or library(MPI)
    for collective in opts.collectives:
        for nbytes in (parse_size(s) for s in opts.sizes.split(",")):
            call, check, size = call_for(comm, MPI, collective, nbytes)
            iters = iters_for(comm, MPI, call)
            for _ in range(max(2, iters // 10)):
                call()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            seconds = comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)
            ok = comm.allreduce(check(), op=MPI.LAND)
            if comm.Get_rank() == 0:
                print(json.dumps({"impl": label, "collective": collective,
                                  "P": comm.Get_size(), "bytes": size,
                                  "time_us": round(seconds * 1e6, 3), "ok": ok}), flush=True)


if __name__ == "__main__":
    main()
