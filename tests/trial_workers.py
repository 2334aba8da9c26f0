"""Rank functions of test_trials (module level, so spawned ranks import them)."""
import os

import numpy as np

SIZES = (8, 4096, 32768, 1 << 20)


def settle(comm, calls=15):
    """{nbytes: (model's choice, what runs after `calls` blocking calls)}, results checked."""
    out = {}
    for n in SIZES:
        x = np.full(n // 4, comm.rank + 1, np.float32)
        model = comm._engine.decider.decide("allreduce", n).candidate.label
        for _ in range(calls):
            assert comm.allreduce(x)[0] == sum(range(1, comm.world_size + 1))
        out[n] = (model, comm.algorithm_for("allreduce", n))
    out["tried"] = any(t is not None for t in comm._engine.decider._trials.values())
    return out


def mixed_with_nonblocking(comm):
    """Nonblocking calls of a size class on trial run the model's choice meanwhile:
    every result right, no mismatch."""
    x = np.full(8192, comm.rank + 1, np.float64)
    want = sum(range(1, comm.world_size + 1))
    wrong = 0
    for i in range(20):
        if i % 3 == 0:
            work = comm.allreduce(x, async_op=True)
            wrong += int(np.count_nonzero(work.wait() != want))
        else:
            wrong += int(np.count_nonzero(comm.allreduce(x) != want))
    return wrong, comm.algorithm_for("allreduce", x.nbytes)


def untried(comm, mode):
    """SHMCOLL_TUNE=off (a child communicator made with it), or a named algorithm:
    no trial starts."""
    os.environ["SHMCOLL_TUNE"] = mode
    child = comm.split(0)
    try:
        x = np.ones(8192, np.float32)
        for _ in range(15):
            child.allreduce(x, algo="ring" if mode == "auto" else None)
        decider = child._engine.decider
        return dict(decider._trials), child.algorithm_for("allreduce", x.nbytes) == \
            decider.decide("allreduce", x.nbytes).candidate.label
    finally:
        child.close()
        os.environ.pop("SHMCOLL_TUNE")


def count_down(comm):
    """{nbytes: [calls_until_settled before each blocking call, until it is 0]}."""
    out = {}
    for n in SIZES:
        x = np.full(n // 4, comm.rank + 1, np.float32)
        left = [comm.calls_until_settled("allreduce", n)]
        while left[-1] and len(left) < 100:
            comm.allreduce(x)
            left.append(comm.calls_until_settled("allreduce", n))
        out[n] = left
    return out


def symmetric_settle(comm):
    """Calls on symmetric arrays (Communicator.empty) settle their trials too: every
    result right while the candidates take turns, blocking and nonblocking mixed, and
    the same winner on every rank.  {collective: (calls until settled at the start,
    the winner)}."""
    P, want = comm.world_size, sum(range(1, comm.world_size + 1))
    out = {}
    for coll in ("broadcast", "allgather", "allreduce", "reduce_scatter"):
        x = comm.empty(P * (8192 // P), np.float32)   # ~32 KiB, whole blocks of P
        n = x.nbytes * (P if coll == "allgather" else 1)    # as shmcoll.collectives prices it
        start = comm.calls_until_settled(coll, n, symmetric="plain")
        for i in range(2 * start + 3):      # (nonblocking calls are not the trial's)
            if i >= 3 and not comm.calls_until_settled(coll, n, symmetric="plain"):
                break
            x[...] = comm.rank + 1
            if coll == "broadcast":
                comm.broadcast(x, root=1)
                assert np.all(x == 2)
            elif coll == "allgather":
                got = comm.allgather(x)
                assert np.array_equal(got[:, 0], np.arange(1, P + 1))
            elif coll == "allreduce":
                got = comm.allreduce(x, async_op=True).wait() if i % 4 == 3 else comm.allreduce(x)
                assert np.all(got == want)
            else:
                assert np.all(comm.reduce_scatter(x) == want)
        out[coll] = (start, comm.calls_until_settled(coll, n, symmetric="plain"),
                     comm.algorithm_for(coll, n, symmetric="plain"))
    return out


def inline_untried(comm):
    """Calls small enough for the call records: [(collective, bytes, calls until
    settled, what runs)] after a few blocking calls of each."""
    P, out = comm.world_size, []
    for coll in ("allreduce", "allgather", "broadcast"):
        x = np.ones(2, np.float32)
        for _ in range(15):
            if coll == "allgather":
                comm.allgather(x)
            else:
                getattr(comm, coll)(x)
        n = x.nbytes * (P if coll == "allgather" else 1)
        out.append((coll, n, comm.calls_until_settled(coll, n), comm.algorithm_for(coll, n)))
    return out
