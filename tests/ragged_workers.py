"""Rank functions of test_ragged: uneven blocks and Python objects (module level, so
spawned ranks import them)."""
import numpy as np

from shmcoll.errors import MismatchError


def block(rank, rows, tail, dtype, seed=0):
    """Rank's block: rows x tail of small integers, distinct per rank."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-50, 50, (rows,) + tuple(tail)).astype(dtype)


def uneven(comm, counts, tail, dtype, root):
    r = comm.rank
    mine = block(r, counts[r], tail, dtype)
    full = np.concatenate([block(q, counts[q], tail, dtype) for q in range(comm.world_size)])
    got = {"allgatherv": comm.allgatherv(mine), "gatherv": comm.gatherv(mine, root=root),
           "scatterv": comm.scatterv(full if r == root else None,
                                     counts if r == root else None, root=root)}
    x = block(100 + r, sum(counts), tail, dtype)
    got["reduce_scatter"] = comm.reduce_scatter(x, counts=counts, op="sum")
    got["reduce_scatter_max"] = comm.reduce_scatter(x, counts=counts, op="max")
    return got


def disagreeing(comm):
    """Ranks whose blocks differ after the first dimension, then different counts:
    every rank raises, and the communicator goes on working."""
    seen = []
    tail = (2, 3) if comm.rank % 2 == 0 else (3, 2)
    try:
        comm.allgatherv(np.zeros((comm.rank,) + tail))
        seen.append(None)
    except MismatchError as e:
        seen.append((e.field, str(e)))
    counts = [1] * comm.world_size
    counts[0] += comm.rank          # different on every rank
    try:
        comm.reduce_scatter(np.zeros(sum(counts)), counts=counts)
        seen.append(None)
    except MismatchError as e:
        seen.append((e.field, str(e)))
    seen.append(float(comm.allreduce(np.ones(1))[0]))
    return seen


class Node:
    def __init__(self, name, children=()):
        self.name, self.children = name, list(children)

    def __eq__(self, other):
        return isinstance(other, Node) and (self.name, self.children) == (other.name,
                                                                            other.children)


def payload(rank):
    """Objects of every kind and size, different per rank."""
    return {"rank": rank, "text": "é" * (rank * 37), "none": None,
            "array": np.arange(rank * 1000, dtype=np.float64).reshape(-1, 10)
            if rank else np.zeros((0, 10)),
            "strided": np.arange(40, dtype=np.int32)[::3],
            "many": [np.full(3, i, np.int16) for i in range(70)],
            "tree": Node("root", [Node(str(i)) for i in range(rank)])}


def objects(comm, root):
    r, P = comm.rank, comm.world_size
    got = {"broadcast": comm.broadcast_object(payload(root) if r == root else None, root),
           "allgather": comm.allgather_object(payload(r)),
           "gather": comm.gather_object(payload(r), root),
           "scatter": comm.scatter_object([payload(q) for q in range(P)] if r == root else
                                          None, root)}
    big = comm.broadcast_object(payload(1) if r == root else None, root)["array"]
    got["not_copied_twice"] = r == root or (big.base is not None and not big.flags.owndata)
    return got


def bad_calls(comm):
    """Counts that do not fit x, a negative count, a count that is not a number."""
    out = []
    for call in (lambda: comm.reduce_scatter(np.zeros(3), counts=[1, 1]),
                 lambda: comm.reduce_scatter(np.zeros(2), counts=[1, -1]),
                 lambda: comm.reduce_scatter(np.zeros(2), counts=[1, "x"])):
        try:
            call()
            out.append(None)
        except Exception as e:  # noqa: BLE001 - the test checks the type
            out.append(type(e).__name__)
    return out


def one_rank_refuses(comm):
    """Each call with a bad argument on one rank only (the last, or the root 0): every
    rank raises (that rank its own error, the others a ValueError naming it) instead
    of waiting for it; the communicator goes on working."""
    P, r, last = comm.world_size, comm.rank, comm.world_size - 1
    calls = {
        "allgatherv": lambda: comm.allgatherv(np.float64(1.0) if r == last else np.ones(2)),
        "reduce_scatter": lambda: comm.reduce_scatter(
            np.ones(P + (r == last)), counts=[1] * P),
        "scatterv": lambda: comm.scatterv(np.ones(P + 1) if r == 0 else None, [1] * P,
                                          root=0),
        "broadcast_object": lambda: comm.broadcast_object(lambda: 0 if r == 0 else None, 0),
        "allgather_object": lambda: comm.allgather_object(
            (lambda: 0) if r == last else r),
        "scatter_object": lambda: comm.scatter_object([1] if r == 0 else None, 0),
    }
    seen = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = None
        except Exception as e:  # noqa: BLE001 - the test checks type and text
            seen[name] = (type(e).__name__, str(e))
    seen["after"] = float(comm.allreduce(np.ones(1))[0])
    return seen
