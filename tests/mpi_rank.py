"""One rank of test_mpi, started by mpiexec: shmcoll.mpi.Communicator with the node
layout argv[1] (SHMCOLL_NODE per rank, "0,0,1,1"); prints one JSON line of problems
per rank.  argv[2] says what to run:

  grid     every collective x dtype x op x shape with algo 'auto', against numpy
  algos    every collective with every composition this layout can run (a few dtypes
           and ops each), blocking and async_op, a blocking call among async ones
  split    split by several colors (None among them) and keys, collectives on the
           children, a grandchild outliving its parent
  die      rank 1 is killed in the middle of an allreduce
  leave    the last rank leaves its node's job; the others report what they raised
  mismatch the nodes gather arrays of different sizes; every rank reports what it raised
"""
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

from mpi4py import MPI  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
os.environ["SHMCOLL_NODE"] = "node" + sys.argv[1].split(",")[rank]

import numpy as np  # noqa: E402

import shmcoll.mpi  # noqa: E402
from reference import ALL_DTYPES, make_input, ops_for, reduce_ref  # noqa: E402

BOOL_OPS = {"max": np.logical_or, "bor": np.logical_or, "min": np.logical_and}


CHECKED = [0]


def check(problems, what, got, want):
    CHECKED[0] += 1
    if got is None or want is None:
        if got is not want:
            problems.append(f"{what}: got {type(got).__name__}, expected {want!r}")
        return
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        problems.append(f"{what}: got {got.ravel()[:4]}, expected {want.ravel()[:4]}")


def inputs(P, shape, dt, op):
    if dt == "bool":
        return [make_input(q, shape, "uint8", "bor") % 2 == 1 for q in range(P)]
    return [make_input(q, shape, dt, op) for q in range(P)]


def reduced(xs, op, dt):
    if dt == "bool":
        return BOOL_OPS[op].reduce(np.stack(xs), axis=0)
    return reduce_ref(xs, op, dt)


def calls(comm, dt, op, shape, algo, async_op):
    """[(name, result or Work, expected)] of every collective on one case."""
    P, r = comm.world_size, comm.rank
    kw = {"algo": algo} if algo else {}
    kw["async_op"] = async_op

    def allowed(coll):
        return algo is None or algo in comm.compositions(coll)

    out = []
    xs = inputs(P, shape, dt, op)
    ref = reduced(xs, op, dt)
    tag = f"{dt} {op} {shape} {algo} async={async_op}"
    if allowed("allreduce"):
        out.append(("allreduce " + tag, comm.allreduce(xs[r], op=op, **kw), ref))
    if allowed("reduce"):
        for root in (0, P - 1):
            out.append((f"reduce {root} " + tag, comm.reduce(xs[r], op=op, root=root, **kw),
                        ref if r == root else None))
    if allowed("reduce_scatter"):
        ys = inputs(P, (P * 2,) + shape[1:], dt, op)
        out.append(("reduce_scatter " + tag, comm.reduce_scatter(ys[r], op=op, **kw),
                    reduced(ys, op, dt)[2 * r:2 * r + 2]))
    stack = np.stack(xs)
    if allowed("allgather"):
        out.append(("allgather " + tag, comm.allgather(xs[r], **kw), stack))
    for root in (0, P - 1):
        if allowed("broadcast"):
            b = xs[r].copy() if r == root else np.zeros_like(xs[r])
            out.append((f"broadcast {root} " + tag, comm.broadcast(b, root=root, **kw), xs[root]))
        if allowed("gather"):
            out.append((f"gather {root} " + tag, comm.gather(xs[r], root=root, **kw),
                        stack if r == root else None))
        if allowed("scatter"):
            got = comm.scatter(stack if r == root else None, out=np.empty_like(xs[r]),
                               root=root, **kw)
            out.append((f"scatter {root} " + tag, got, stack[r]))
    return out


def settle(problems, results):
    for what, got, want in results:
        if isinstance(got, shmcoll.Work):
            got = got.wait(60)
        check(problems, what, got, want)


def grid(comm, problems):
    P, r = comm.world_size, comm.rank
    for dt in ALL_DTYPES + ["bool"]:
        ops = list(BOOL_OPS) if dt == "bool" else ops_for(dt)
        for op in ops:
            for shape in [(0,), (3,), (1001, 2)]:
                settle(problems, calls(comm, dt, op, shape, None, False))
        kind = dt if dt != "bool" else "uint8"
        a2a = [make_input(q, (P, 4), kind, "sum") for q in range(P)]
        check(problems, f"alltoall {dt}", comm.alltoall(a2a[r]),
              np.stack([a2a[q][r] for q in range(P)]))


def algos(comm, problems):
    names = sorted({n for c in ("allreduce", "allgather", "broadcast") for n in
                    comm.compositions(c)})
    cases = [("float32", "sum"), ("float16", "avg"), ("int32", "max"), ("uint8", "bxor"),
             ("bool", "bor"), ("float64", "prod")]
    for algo in names:
        for dt, op in cases:
            for shape in [(0,), (5,), (40001,)]:
                settle(problems, calls(comm, dt, op, shape, algo, False))
                settle(problems, calls(comm, dt, op, shape, algo, True))
    # in place (x is out), with every composition
    for algo in names:
        for dt, op in cases:
            xs = inputs(comm.world_size, (1001,), dt, op)
            mine = xs[comm.rank].copy()
            got = comm.allreduce(mine, out=mine, op=op, algo=algo)
            check(problems, f"in-place allreduce {dt} {op} {algo}", mine, reduced(xs, op, dt))
            if got is not mine:
                problems.append(f"in-place allreduce {algo} returned another array")
    # bad out: refused on every rank before anything moves; the communicator goes on
    x = np.ones(8, np.float32)
    for bad in (np.empty(9, np.float32), np.empty(8, np.float64), np.empty(16, np.float32)[::2],
                np.empty(8, np.float32).view(np.float32)[::-1]):
        try:
            comm.allreduce(x, out=bad)
            problems.append(f"allreduce accepted out {bad.shape} {bad.dtype}")
        except ValueError:
            pass
    for call in (lambda: comm.allgather(x, out=np.empty((1, 8), np.float32)),
                 lambda: comm.reduce_scatter(np.ones(comm.world_size + 1)),
                 lambda: comm.alltoall(np.ones(comm.world_size + 1)),
                 lambda: comm.allreduce(x, algo="bruck")):
        try:
            call()
            problems.append("a bad call was accepted")
        except ValueError:
            pass
    try:
        comm.broadcast([1, 2, 3])
        problems.append("broadcast accepted a list")
    except TypeError:
        pass
    check(problems, "after refused calls", comm.allreduce(x), x * comm.world_size)
    # async calls, a blocking one among them, waited in reverse order
    xs = [np.full(1000, q + 1.0) for q in range(comm.world_size)]
    works = [comm.allreduce(xs[comm.rank] * k, async_op=True) for k in range(1, 6)]
    middle = comm.allgather(np.array([comm.rank]))
    works += [comm.barrier(async_op=True)]
    check(problems, "blocking among async", middle, np.arange(comm.world_size)[:, None])
    total = sum(xs)
    for k, w in reversed(list(enumerate(works[:-1], 1))):
        check(problems, f"async allreduce {k}", w.wait(60), total * k)
    works[-1].wait(60)
    if not all(w.is_completed() and w.exception() is None for w in works):
        problems.append("a waited Work is not completed")
    line = comm.choice("allreduce", 1 << 20).describe(1 << 20)
    if "modelled us" not in line and comm.nodes > 1 and comm.local_size > 1:
        problems.append(f"choice line: {line}")


def split(comm, problems):
    P, r = comm.world_size, comm.rank
    patterns = [("halves", lambda q: q % 2, None), ("reversed", lambda q: 0, lambda q: P - q),
                ("pairs", lambda q: q // 2, lambda q: q),
                ("thirds", lambda q: None if q % 3 == 2 else q % 3, lambda q: -q)]
    for label, color_of, key_of in patterns:
        child = comm.split(color_of(r), key_of(r) if key_of else None)
        if color_of(r) is None:
            if child is not None:
                problems.append(f"split {label}: color None gave {child!r}")
            continue
        same = [q for q in range(P) if color_of(q) == color_of(r)]
        order = sorted(same, key=lambda q: (key_of(q) if key_of else q, q))
        if (child.rank, child.world_size) != (order.index(r), len(order)):
            problems.append(f"split {label}: rank {child.rank} of {child.world_size}, "
                            f"expected {order.index(r)} of {len(order)}")
        check(problems, f"split {label} allreduce", child.allreduce(np.array([float(r)])),
              np.array([float(sum(order))]))
        check(problems, f"split {label} allgather", child.allgather(np.array([r])),
              np.array([[q] for q in order]))
        if label == "halves":       # every collective on a child, which closes its parent
            settle(problems, calls(child, "int64", "max", (7,), None, False))
            grandchild = child.split(child.rank % 2)
            child.close()
            settle(problems, calls(grandchild, "float32", "sum", (3, 2), None, True))
            grandchild.close()
        else:
            child.close()
    if comm.split(None) is not None:
        problems.append("split(None) returned a communicator")


def main(what):
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    assert repr(comm).startswith("<shmcoll.mpi.Communicator")
    problems = []
    {"grid": grid, "algos": algos, "split": split}[what](comm, problems)
    comm.barrier()
    line = json.dumps({"rank": comm.rank, "nodes": comm.nodes,
                       "local": [comm.local_rank, comm.local_size], "checked": CHECKED[0],
                       "problems": problems[:10]})
    os.write(1, (line + "\n").encode())     # one write: ranks share the pipe
    comm.close()


def die():
    """Rank 1 is killed inside an allreduce (the launcher then ends the job)."""
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    comm.barrier()                  # every node's job formed (its name unlinked)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(100):
        comm.allreduce(np.ones(1 << 16))


def mismatch():
    """Node 1's ranks gather arrays one element longer than node 0's (each node agrees
    inside itself): the leaders' check between nodes must refuse it on every rank."""
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    x = np.ones(4 + comm.node_index)
    try:
        comm.allgather(x, algo="leader")
        raised = None
    except shmcoll.ShmcollError as e:
        raised = e
    os.write(1, (json.dumps({"rank": comm.rank, "leader": comm.leader,
                             "raised": type(raised).__name__,
                             "message": str(raised)[:300]}) + "\n").encode())
    comm.close()
    sys.exit(3)


def leave():
    """The last rank leaves its node's job in the middle of a run of allreduces: every
    other rank must raise (PeerLostError: its node's peers from the engine, the other
    nodes' ranks from the failure notice), report it, and end without hanging."""
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD, timeout=60)
    last = comm.world_size - 1
    try:
        for k in range(200):
            if comm.rank == last and k == 20:
                comm.node.close()
            comm.allreduce(np.ones(1 << 14))
        raised = None
    except shmcoll.ShmcollError as e:
        raised = e
    os.write(1, (json.dumps({"rank": comm.rank, "raised": type(raised).__name__,
                             "message": str(raised)[:300]}) + "\n").encode())
    comm.close()
    sys.exit(3)


if sys.argv[2] in ("die", "leave", "mismatch"):
    {"die": die, "leave": leave, "mismatch": mismatch}[sys.argv[2]]()
else:
    main(sys.argv[2])
