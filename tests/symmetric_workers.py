"""Rank functions of test_symmetric: collectives on symmetric allocations (module
level, so spawned ranks import them)."""
import gc
import time

import numpy as np

import shmcoll
from shmcoll.errors import MismatchError

SIZES = (0, 1, 7, 1001, 70001)      # 70001 float32 > one 256 KiB chunk: several chunks


def rank_values(rank, n, dtype, salt=0):
    """Small integers, exact in every dtype, distinct per rank."""
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + rank * 3 + salt) % 11 + 1).astype(dtype)


def _symmetric(comm, n, dtype, rank, salt=0, offset=0):
    """A symmetric array of n elements holding rank_values, `offset` elements into its
    allocation (the same on every rank)."""
    buf = comm.empty(n + offset + 1, dtype)
    x = buf[offset:offset + n]
    x[...] = rank_values(rank, n, dtype, salt)
    return x


def every_collective(comm, dtype, op, offset, algo):
    """{(collective, n, variant): result} of every single-copy collective."""
    P, r = comm.world_size, comm.rank
    root = P - 1
    got = {}
    for n in SIZES:
        x = _symmetric(comm, n, dtype, r, 0, offset)
        got["allreduce", n, "plain"] = comm.allreduce(x, op=op, algo=algo)
        out = _symmetric(comm, n, dtype, r, 5, offset)
        comm.allreduce(x, out=out, op=op, algo=algo)
        got["allreduce", n, "symmetric out"] = out.copy()
        comm.allreduce(x, out=x, op=op, algo=algo)
        got["allreduce", n, "in place"] = x.copy()
        big = _symmetric(comm, n * P, dtype, r, 0, offset)
        got["reduce_scatter", n, "plain"] = comm.reduce_scatter(big, op=op, algo=algo)
        comm.reduce_scatter(big, out=big[r * n:(r + 1) * n], op=op, algo=algo)
        got["reduce_scatter", n, "in place"] = big[r * n:(r + 1) * n].copy()
        x = _symmetric(comm, n, dtype, r, 0, offset)
        got["reduce", n, "plain"] = comm.reduce(x, op=op, root=root, algo=algo)
        got["allgather", n, "plain"] = comm.allgather(x, algo=algo)
        got["gather", n, "plain"] = comm.gather(x, root=root, algo=algo)
        rows = comm.empty((P, n), dtype)
        rows[r] = rank_values(r, n, dtype)
        got["allgather", n, "in place"] = comm.allgather(rows[r], out=rows, algo=algo).copy()
        rows = comm.empty((P, n), dtype)
        rows[r] = rank_values(r, n, dtype)
        got["gather", n, "in place"] = comm.gather(rows[r], out=rows, root=root, algo=algo)
        b = _symmetric(comm, n, dtype, r, 0, offset)
        comm.broadcast(b, root=root, algo=algo)
        got["broadcast", n, "plain"] = b.copy()
    return got


def chosen(comm, nbytes):
    return {case: comm.algorithm_for("allreduce", nbytes, symmetric=case)
            for case in ("plain", "symmetric", "in place")}


def reuse_at_once(comm, rounds):
    """Each rank rewrites its array right after every call, the odd rank late or early:
    no peer may still be reading it (every result checked)."""
    P, r = comm.world_size, comm.rank
    x = comm.empty(4096, np.float64)
    out = comm.empty(4096, np.float64)
    wrong = 0
    for k in range(rounds):
        x[:] = rank_values(r, 4096, np.float64, k)
        if r == P - 1 and k % 7 == 0:
            time.sleep(0.002)
        variant = ("plain", "symmetric", "in place")[k % 3]
        if variant == "plain":
            y = comm.allreduce(x)
        elif variant == "symmetric":
            y = comm.allreduce(x, out=out, algo="symmetric")
        else:
            y = comm.allreduce(x, out=x, algo="symmetric")
        want = sum(rank_values(q, 4096, np.float64, k) for q in range(P))
        wrong += int(np.count_nonzero(y != want))
        x[:] = -1.0         # at once: a peer still reading would see it
        wrong += rooted_reuse(comm, x, k, "symmetric")
    return wrong


def rooted_reuse(comm, x, k, algo):
    """Wrong elements of a Broadcast and a Gather from root k % P, every rank rewriting
    x as soon as each returned, rank P-1 late every 7th call (so sometimes the root):
    no root may still read a peer's x, nor a push into a peer still land, once the
    call returned there (single copy ends these on the root alone)."""
    P, r, n = comm.world_size, comm.rank, x.size
    root, wrong = k % P, 0
    x[:] = rank_values(root, n, x.dtype, k) if r == root else 0
    if r == P - 1 and k % 7 == 0:
        time.sleep(0.002)
    comm.broadcast(x, root=root, algo=algo)
    wrong += int(np.count_nonzero(x != rank_values(root, n, x.dtype, k)))
    x[:] = -1
    comm.barrier()
    wrong += int(np.count_nonzero(x != -1))      # a push landing late shows here
    x[:] = rank_values(r, n, x.dtype, k)
    if r == P - 1 and k % 7 == 3:
        time.sleep(0.002)
    rows = comm.gather(x, root=root, algo=algo)
    x[:] = -1
    if r == root:
        want = np.stack([rank_values(q, n, x.dtype, k) for q in range(P)])
        wrong += int(np.count_nonzero(rows != want))
    return wrong


def nonblocking(comm):
    x = _symmetric(comm, 5000, np.float32, comm.rank)
    w = comm.allreduce(x, out=x, algo="symmetric", async_op=True)
    w.wait()
    return x.copy()


def lifetime(comm):
    """An allocation is forgotten once its arrays are gone; the name is never left in
    /dev/shm; an array outlives its communicator."""
    from shmcoll._core import segment
    before = set(segment.list_entries())
    x = comm.empty((3, 5), np.int32)
    comm.barrier()      # rank 0 unlinks the name once every rank reported its mapping
    after = set(segment.list_entries())
    address = x.ctypes.data
    known = comm._engine.symmetric_place(address, x.nbytes)
    del x
    gc.collect()
    forgotten = comm._engine.symmetric_place(address, 4) is None
    kept = comm.zeros(10, np.float64)
    return {"left": sorted(after - before), "known": known, "forgotten": forgotten,
            "zeros": bool((kept == 0).all()), "shape": comm.empty((2, 3), np.int16).shape}


def different_requests(comm):
    """Ranks asking for different arrays: every rank raises ValueError, and the
    communicator goes on."""
    outcome = []
    for shape, dtype in (((4 + comm.rank,), np.float32), ((4,), (np.float32, np.int32)[comm.rank % 2])):
        try:
            comm.empty(shape, dtype)
            outcome.append("ok")
        except ValueError as e:
            outcome.append(str(e))
    outcome.append(float(comm.allreduce(np.ones(3, np.float32))[0]))
    return outcome


def mismatched(comm, how):
    """Ranks that disagree on where x lies: every rank raises MismatchError."""
    r, n = comm.rank, 1 << 16      # large enough that the cost model picks single copy
    buf = comm.empty(2 * n, np.float32)
    buf[:] = 1
    if how == "one ordinary":
        x = buf[:n] if r else np.ones(n, np.float32)
    else:       # another offset on rank 0
        x = buf[1:n + 1] if r == 0 else buf[:n]
    try:
        comm.allreduce(x, algo=None if how == "one ordinary" else "symmetric")
        return "ok"
    except MismatchError as e:
        return f"MismatchError: {e}"


def launch(fn, world, *args):
    return shmcoll.launch(fn, world, args=args, timeout=60)


def torch_tensor_views(comm):
    """A torch tensor over a symmetric array is the same memory: single copy."""
    import torch
    x = torch.from_numpy(comm.empty(70001, np.float32))
    x[:] = torch.from_numpy(rank_values(comm.rank, 70001, np.float32))
    got = comm.allreduce(x, out=x, algo="symmetric")
    return got is x, x.numpy().copy()


def peer_leaves(comm):
    """Rank 1 leaves instead of joining a single-copy call: the others raise
    PeerLostError naming it instead of reading a buffer no one will finish."""
    x = comm.empty(1 << 16, np.float32)
    if comm.rank == 1:
        comm.close()
        return "left"
    try:
        comm.allreduce(x, out=x, algo="symmetric")
        return "ok"
    except shmcoll.PeerLostError as e:
        return f"PeerLostError: {e}"
