"""One rank of test_mpi, started by mpiexec: shmcoll.mpi.Communicator with the node
layout argv[1] (SHMCOLL_NODE per rank, "0,0,1,1"), every collective x dtype x op on
the reference inputs against numpy; prints one JSON line of problems per rank.
With argv[2] == "die", rank 1 exits in the middle of an allreduce instead."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from mpi4py import MPI  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
os.environ["SHMCOLL_NODE"] = "node" + sys.argv[1].split(",")[rank]

import numpy as np  # noqa: E402

import shmcoll.mpi  # noqa: E402
from reference import ALL_DTYPES, make_input, ops_for, reduce_ref  # noqa: E402


def check(problems, what, got, want):
    if got is None or want is None:
        if got is not want:
            problems.append(f"{what}: got {type(got).__name__}, expected {want!r}")
        return
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        problems.append(f"{what}: got {got.ravel()[:4]}, expected {want.ravel()[:4]}")


def main():
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    assert repr(comm).startswith("<shmcoll.mpi.Communicator")
    P, r, problems = comm.world_size, comm.rank, []
    shapes = [(0,), (3,), (1001, 2)]
    for dt in ALL_DTYPES + ["bool"]:
        ops = ["max", "min", "bor"] if dt == "bool" else ops_for(dt)
        for op in ops:
            for shape in shapes:
                def inp(q, s=shape):
                    if dt == "bool":
                        return make_input(q, s, "uint8", "bor") % 2 == 1
                    return make_input(q, s, dt, op)
                xs = [inp(q) for q in range(P)]
                ref = reduce_ref(xs, op, dt) if dt != "bool" else \
                    {"max": np.logical_or, "bor": np.logical_or,
                     "min": np.logical_and}[op].reduce(np.stack(xs), axis=0)
                tag = f"{dt} {op} {shape}"
                check(problems, "allreduce " + tag, comm.allreduce(xs[r], op=op), ref)
                for root in (0, P - 1):
                    got = comm.reduce(xs[r], op=op, root=root)
                    check(problems, f"reduce {root} " + tag, got, ref if r == root else None)
                rows = (P * 2,) + shape[1:]
                ys = [inp(q, rows) for q in range(P)]
                full = reduce_ref(ys, op, dt) if dt != "bool" else \
                    {"max": np.logical_or, "bor": np.logical_or,
                     "min": np.logical_and}[op].reduce(np.stack(ys), axis=0)
                check(problems, "reduce_scatter " + tag, comm.reduce_scatter(ys[r], op=op),
                      full[2 * r:2 * r + 2])
        x = make_input(r, (5, 3), dt if dt != "bool" else "uint8", "sum")
        stack = np.stack([make_input(q, (5, 3), dt if dt != "bool" else "uint8", "sum")
                          for q in range(P)])
        check(problems, f"allgather {dt}", comm.allgather(x), stack)
        for root in (0, P - 1):
            b = x.copy() if r == root else np.zeros_like(x)
            check(problems, f"broadcast {root} {dt}", comm.broadcast(b, root=root),
                  make_input(root, (5, 3), dt if dt != "bool" else "uint8", "sum"))
            check(problems, f"gather {root} {dt}", comm.gather(x, root=root),
                  stack if r == root else None)
            got = comm.scatter(stack if r == root else None, out=np.empty_like(x), root=root)
            check(problems, f"scatter {root} {dt}", got, stack[r])
        kind = dt if dt != "bool" else "uint8"
        a2a = [make_input(q, (P, 4), kind, "sum") for q in range(P)]
        check(problems, f"alltoall {dt}", comm.alltoall(a2a[r]),
              np.stack([a2a[q][r] for q in range(P)]))
    comm.barrier()
    line = json.dumps({"rank": r, "nodes": comm.nodes, "local": [comm.local_rank, comm.local_size],
                       "problems": problems[:10]})
    os.write(1, (line + "\n").encode())     # one write: ranks share the pipe
    comm.close()


def die():
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    comm.barrier()                  # every node's job formed (its name unlinked)
    if comm.rank == 1:
        os._exit(3)
    comm.allreduce(np.ones(1 << 16))


die() if sys.argv[2:] == ["die"] else main()
