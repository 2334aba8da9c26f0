"""Rank functions of test_split (module level, so spawned ranks import them)."""
import numpy as np


def split_and_use(comm, colors, keys):
    """Split by colors[rank] / keys[rank]; in the child: its rank and size, an
    allreduce of the parent ranks, an allgather, a nested split in halves, and
    point-to-point around the child's ring.  Children are closed before the parent
    goes on."""
    r = comm.rank
    child = comm.split(colors[r], keys[r])
    if child is None:
        after = float(comm.allreduce(np.ones(1))[0])
        return None, after
    with child:
        seen = {"rank": child.rank, "size": child.world_size,
                "sum": float(child.allreduce(np.array([float(r)]))[0]),
                "order": child.allgather(np.array([r])).ravel().tolist()}
        half = child.split(child.rank % 2, key=-child.rank)
        with half:
            seen["half"] = half.allgather(np.array([r])).ravel().tolist()
        nxt, prv = (child.rank + 1) % child.world_size, (child.rank - 1) % child.world_size
        seen["ring"] = int(child.sendrecv(np.array([r]), nxt, src=prv)[0])
    after = float(comm.allreduce(np.ones(1))[0])
    return seen, after


def parent_closed_first(comm):
    """The parent is closed before its child is used: the child goes on working."""
    child = comm.split(0)
    comm.close()
    try:
        return float(child.allreduce(np.ones(2))[0])
    finally:
        child.close()


def bad_split(comm):
    """One rank passes a color that is refused: every rank raises, and the parent
    goes on."""
    seen = []
    for color in (-1 if comm.rank == 0 else 0, "red" if comm.rank == 1 else 0):
        try:
            comm.split(color)
            seen.append(None)
        except (TypeError, ValueError) as e:
            seen.append((type(e).__name__, str(e)))
    seen.append(float(comm.allreduce(np.ones(1))[0]))
    return seen
