"""shmcoll.mpi's hierarchical allreduce beside the MPI library's own, on the same
processes, one JSON line per size and implementation (float32 sum; nccl-tests' time: the max
over ranks of the mean per call; the median of interleaved rounds), every
composition shmcoll.mpi can run here, its automatic pick, and MPI_Allreduce.

    SHMCOLL_NODES=0,0,1,1 mpiexec -n 4 python bench/mpi_hierarchy.py --sizes 8,4K,1M,64M

SHMCOLL_NODES gives each rank's node (SHMCOLL_NODE per rank), so one machine plays
several nodes; the MPI step between those "nodes" then goes through the MPI library's
own shared-memory transport: this measures the composition's overhead, not a network.
"""
import argparse
import json
import os
import sys
import time

from mpi4py import MPI

_layout = os.environ.get("SHMCOLL_NODES")
if _layout:
    os.environ["SHMCOLL_NODE"] = "node" + _layout.split(",")[MPI.COMM_WORLD.Get_rank()]

import numpy as np  # noqa: E402

import shmcoll.mpi  # noqa: E402
from shmcoll._core.sizes import parse_size  # noqa: E402


def timed(world, call, n):
    for _ in range(max(2, n // 10)):
        call()
    world.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return world.allreduce((time.perf_counter() - start) / n, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,512,4K,32K,256K,1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    comm = shmcoll.mpi.Communicator(world)
    algos = comm.compositions("allreduce") + ["auto"]
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        x = np.full(max(1, nbytes // 4), 1.0, np.float32)
        out = np.empty_like(x)
        n = args.iters or max(5, min(1000, int(3e7 / max(nbytes, 1))))
        calls = {f"shmcoll.mpi {a}": (lambda a=a: comm.allreduce(x, out=out, algo=a))
                 for a in algos}
        calls["MPI_Allreduce"] = lambda: world.Allreduce(x, out)
        times = {impl: [] for impl in calls}
        ok = True
        for _ in range(args.rounds):            # interleaved: drift hits every impl alike
            for impl, call in calls.items():
                out[...] = 0
                times[impl].append(timed(world, call, n))
                ok = ok and bool(out[0] == world.Get_size())
        if world.Get_rank() == 0:
            picked = comm.algorithm_for("allreduce", x.nbytes)
            for impl, seconds in times.items():
                print(json.dumps({"impl": impl, "P": world.Get_size(), "nodes": comm.nodes,
                                  "bytes": x.nbytes,
                                  "time_us": round(float(np.median(seconds)) * 1e6, 3),
                                  "auto_picks": picked, "ok": ok}), flush=True)
    comm.close()


if __name__ == "__main__":
    sys.exit(main())
