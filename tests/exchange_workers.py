"""Rank functions of test_alltoall and test_p2p (module level, so spawned ranks import
them).  Every rank can compute any rank's input, so each rank checks its own result
against numpy and returns the problems it found (a list of strings; [] is a pass)."""
import os
import signal
import time

import numpy as np

from reference import dtype_of
from shmcoll import ANY_TAG
from shmcoll._core import settings
from shmcoll.errors import MismatchError
from workers import _wait_for_file


def data(rank, shape, dt, seed=0):
    """Rank's array: distinct small integers, exact in every dtype."""
    rng = np.random.default_rng([seed, rank, int(np.prod(shape, dtype=np.int64))])
    return rng.integers(0, 100, shape).astype(dtype_of(dt))


def _check(problems, what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        problems.append(f"{what}: got {got.dtype} {got.shape}, expected {want.dtype} {want.shape}")


def alltoall_cases(comm, cases):
    """cases: (dtype, row shape, algo).  x is (P, *row) per rank; row q goes to rank q."""
    P, r, problems = comm.world_size, comm.rank, []
    for dt, row, algo in cases:
        shape = (P,) + tuple(row)
        got = comm.alltoall(data(r, shape, dt), algo=algo)
        want = np.stack([data(q, shape, dt)[r] for q in range(P)]) if P else None
        _check(problems, f"alltoall {dt} {row} {algo}", got, want)
        out = np.empty(shape, dtype_of(dt))
        work = comm.alltoall(data(r, shape, dt, 1), out=out, algo=algo, async_op=True)
        assert work.wait() is out
        _check(problems, f"alltoall async {dt} {row} {algo}", out,
               np.stack([data(q, shape, dt, 1)[r] for q in range(P)]))
    return problems


def counts_of(sender, P, scale):
    """Rows `sender` sends to each rank: ragged, with zeros."""
    return [((sender * 3 + q * 5) % 4) * scale for q in range(P)]


def alltoallv_cases(comm, cases):
    """cases: (dtype, row tail, scale): rank s sends counts_of(s)[q] rows to rank q."""
    P, r, problems = comm.world_size, comm.rank, []
    for dt, tail, scale in cases:
        def rows_of(s):
            return data(s, (sum(counts_of(s, P, scale)),) + tuple(tail), dt, 2)
        counts = counts_of(r, P, scale)
        got = comm.alltoallv(rows_of(r), counts)
        parts = []
        for q in range(P):
            cq = counts_of(q, P, scale)
            start = sum(cq[:r])
            parts.append(rows_of(q)[start:start + cq[r]])
        want = np.concatenate(parts)
        _check(problems, f"alltoallv {dt} {tail} {scale}", got, want)
        receives = [counts_of(q, P, scale)[r] for q in range(P)]
        out = np.empty_like(want)
        again = comm.alltoallv(rows_of(r), counts, recv_counts=receives, out=out)
        assert again is out
        _check(problems, f"alltoallv recv_counts {dt}", out, want)
    return problems


def alltoall_refusals(comm):
    """Arguments that are wrong everywhere, on one rank, or only together; afterwards
    the communicator still works."""
    P, r, seen = comm.world_size, comm.rank, {}

    def attempt(name, call):
        try:
            call()
            seen[name] = None
        except (ValueError, TypeError) as e:
            seen[name] = (type(e).__name__, str(e))

    x = np.zeros((P, 3))
    attempt("rows", lambda: comm.alltoall(np.zeros((P + 1, 3))))
    attempt("in_place", lambda: comm.alltoall(x, out=x))
    attempt("counts_length", lambda: comm.alltoallv(np.zeros(3), [3] + [0] * P))
    attempt("counts_sum", lambda: comm.alltoallv(np.zeros(P + 1), [1] * P))
    # one rank expects other rows than its peer sends: every rank raises
    receives = [0] * P
    receives[(r + 1) % P] = 1 if r == P - 1 else 0
    attempt("recv_counts", lambda: comm.alltoallv(np.zeros(0), [0] * P, recv_counts=receives))
    # the row shapes differ
    attempt("tail", lambda: comm.alltoallv(np.zeros((0, 2 + r % 2)), [0] * P))
    seen["after"] = float(comm.alltoall(np.ones((P, 1)))[:, 0].sum())
    return seen


def p2p_basics(comm, dtypes):
    """Ring-shifted send/recv of every dtype and size, tags out of order, ANY_TAG, a
    message to oneself, zero bytes, and p2p interleaved with collectives."""
    P, r, problems = comm.world_size, comm.rank, []
    nxt, prv = (r + 1) % P, (r - 1) % P
    sizes = [0, 1, 1000, 300_001]      # the last spans several slots
    for dt in dtypes:
        for n in sizes:
            mine, theirs = data(r, (n,), dt, 3), data(prv, (n,), dt, 3)
            got = comm.sendrecv(mine, nxt, src=prv, tag=n % 7)
            _check(problems, f"sendrecv {dt} {n}", got, theirs)
    # small sends complete at once, whatever the receiver does: out-of-order tags
    for tag in (3, 1, 2):
        comm.send(np.full(4, tag * 10 + r, np.int32), nxt, tag=tag)
    for tag in (1, 2, 3):
        got = comm.recv(np.empty(4, np.int32), prv, tag=tag)
        _check(problems, f"tag {tag}", got, np.full(4, tag * 10 + prv, np.int32))
    comm.send(np.arange(3.0), nxt, tag=9)
    _check(problems, "any tag", comm.recv(np.empty(3), prv, tag=ANY_TAG), np.arange(3.0))
    # to oneself
    comm.send(np.array([r, 7]), r, tag=5)
    _check(problems, "self", comm.recv(np.empty(2, np.int64), r, tag=5), np.array([r, 7]))
    # a message in flight while collectives run: neither consumes the other's data
    comm.send(np.full(5, float(r)), nxt, tag=4)
    total = comm.allreduce(np.full(5, 1.0))
    gathered = comm.allgather(np.array([r]))
    got = comm.recv(np.empty(5), prv, tag=4)
    _check(problems, "p2p across collectives", got, np.full(5, float(prv)))
    _check(problems, "collectives across p2p", total, np.full(5, float(P)))
    _check(problems, "allgather across p2p", gathered.ravel(), np.arange(P))
    return problems


def p2p_exchanges(comm, n):
    """Large messages both ways at once: blocking sendrecv, and isend + irecv issued
    back to back (the progress thread runs them together, so neither deadlocks)."""
    P, r, problems = comm.world_size, comm.rank, []
    nxt, prv = (r + 1) % P, (r - 1) % P
    big = data(r, (n,), "float64", 4)
    want = data(prv, (n,), "float64", 4)
    _check(problems, "sendrecv", comm.sendrecv(big, nxt, src=prv), want)
    out = np.empty(n)
    sent = comm.send(big, nxt, tag=1, async_op=True)
    got = comm.recv(out, prv, tag=1, async_op=True)
    assert sent.wait() is None and got.wait() is out
    _check(problems, "isend/irecv", out, want)
    out2 = np.empty(n)
    work = comm.sendrecv(big, nxt, out=out2, src=prv, async_op=True)
    assert work.wait() is out2
    _check(problems, "async sendrecv", out2, want)
    # the irecv is issued while the progress thread is already stuck on the isend:
    # it joins the isend's group instead of waiting behind it
    import time
    out3 = np.empty(n)
    sent = comm.send(big, nxt, tag=2, async_op=True)
    time.sleep(0.3)
    got = comm.recv(out3, prv, tag=2, async_op=True)
    sent.wait(timeout=30)
    got.wait(timeout=30)
    _check(problems, "irecv issued late", out3, want)
    return problems


def p2p_completes_on_its_own(comm, n):
    """MPI's patterns of nonblocking point-to-point, where a send or receive must
    complete as its own message does, not with the calls issued before it:
    - irecv from the left, a blocking send to the right, then wait (the receive is
      still pending when the send runs);
    - irecv posted first, then two sends waited one by one that the peer receives
      before it sends what the irecv waits for;
    - two isends to this rank itself (the first larger than the channel) received
      in the other order by blocking receives."""
    P, r, problems = comm.world_size, comm.rank, []
    nxt, prv = (r + 1) % P, (r - 1) % P
    out = np.empty(n)
    pending = comm.recv(out, prv, tag=1, async_op=True)
    comm.send(data(r, (n,), "float64", 1), nxt, tag=1)
    assert pending.wait(timeout=60) is out
    _check(problems, "irecv, send, wait", out, data(prv, (n,), "float64", 1))
    if P > 1:
        first, second = data(r, (n,), "int32", 2), data(r, (3,), "int32", 3)
        if r == 0:
            answer = np.empty(n, np.int32)
            pending = comm.recv(answer, 1, tag=7, async_op=True)
            assert comm.send(first, 1, tag=5, async_op=True).wait(timeout=60) is None
            assert comm.send(second, 1, tag=6, async_op=True).wait(timeout=60) is None
            pending.wait(timeout=60)
            _check(problems, "answer after two sends", answer, data(1, (n,), "int32", 2))
        elif r == 1:
            got1, got2 = np.empty(n, np.int32), np.empty(3, np.int32)
            comm.recv(got1, 0, tag=5)
            comm.recv(got2, 0, tag=6)
            _check(problems, "first of two", got1, data(0, (n,), "int32", 2))
            _check(problems, "second of two", got2, data(0, (3,), "int32", 3))
            comm.send(first, 0, tag=7)
    big, small = data(r, (n,), "float32", 4), data(r, (5,), "float32", 5)
    sends = [comm.send(big, r, tag=8, async_op=True), comm.send(small, r, tag=9, async_op=True)]
    got_small, got_big = comm.recv(np.empty(5, np.float32), r, tag=9), np.empty(n, np.float32)
    comm.recv(got_big, r, tag=8)
    for sent in sends:
        sent.wait(timeout=60)
    _check(problems, "to itself, later tag first", got_small, small)
    _check(problems, "to itself, larger than the channel", got_big, big)
    after = comm.allreduce(np.array([r + 1]))
    _check(problems, "allreduce after", after, np.array([P * (P + 1) // 2]))
    # a receive pending on a split communicator across a collective of its parent
    messages = comm.split(0)
    pending = messages.recv(np.empty(3), prv, tag=4, async_op=True)
    total = comm.allreduce(np.array([r + 1]))
    messages.send(data(r, (3,), "float64", 6), nxt, tag=4)
    _check(problems, "receive across a collective", pending.wait(timeout=60),
           data(prv, (3,), "float64", 6))
    _check(problems, "the collective", total, np.array([P * (P + 1) // 2]))
    messages.close()
    return problems


def p2p_and_collectives_apart(comm, n):
    """Sends and receives never wait for collectives, nor collectives for them, as in
    MPI (each rank still keeps one order of collectives and one of messages):
    - an irecv pending across a blocking allreduce, matched by a send issued after it;
    - an isend larger than the channel pending across an allreduce, received after it;
    - rank 0 sends behind an async allreduce that the others join only after they
      received;
    - async collectives and messages interleaved, waited in reverse order."""
    P, r, problems = comm.world_size, comm.rank, []
    nxt, prv = (r + 1) % P, (r - 1) % P
    total = np.array([P * (P + 1) // 2])
    out = np.empty(n)
    pending = comm.recv(out, prv, tag=1, async_op=True)
    _check(problems, "allreduce behind an irecv", comm.allreduce(np.array([r + 1])), total)
    comm.send(data(r, (n,), "float64", 1), nxt, tag=1)
    assert pending.wait(timeout=60) is out
    _check(problems, "irecv across an allreduce", out, data(prv, (n,), "float64", 1))

    sent = comm.send(data(r, (n,), "float32", 2), nxt, tag=2, async_op=True)
    _check(problems, "allreduce behind an isend", comm.allreduce(np.array([r + 1])), total)
    got = comm.recv(np.empty(n, np.float32), prv, tag=2)
    assert sent.wait(timeout=60) is None
    _check(problems, "isend across an allreduce", got, data(prv, (n,), "float32", 2))

    x = data(r, (n,), "int64", 3)
    if r == 0:
        summed = comm.allreduce(x, async_op=True)
        for q in range(1, P):
            comm.send(data(q, (n,), "int16", 4), q, tag=3)
        summed = summed.wait(timeout=60)
    else:
        _check(problems, "received ahead of the allreduce",
               comm.recv(np.empty(n, np.int16), 0, tag=3), data(r, (n,), "int16", 4))
        summed = comm.allreduce(x)
    _check(problems, "allreduce around sends", summed,
           sum(data(q, (n,), "int64", 3) for q in range(P)))

    first = comm.allreduce(data(r, (n,), "float64", 5), async_op=True)
    message = comm.recv(np.empty(7, np.int32), prv, tag=4, async_op=True)
    gathered = comm.allgather(np.array([r, r * r]), async_op=True)
    fence = comm.barrier(async_op=True)
    comm.send(np.full(7, r, np.int32), nxt, tag=4)
    fence.wait(timeout=60)
    _check(problems, "allgather between messages", gathered.wait(timeout=60),
           np.array([[q, q * q] for q in range(P)]))
    _check(problems, "irecv between collectives", message.wait(timeout=60),
           np.full(7, prv, np.int32))
    _check(problems, "allreduce before messages", first.wait(timeout=60),
           sum(data(q, (n,), "float64", 5) for q in range(P)))
    _check(problems, "allreduce after", comm.allreduce(np.array([r + 1])), total)
    return problems


def p2p_completed_work_outlives_its_group(comm):
    """Rank 0's isend completes ahead of the irecv posted before it; rank 1 takes
    the message and closes without answering.  The irecv fails (the peer is lost),
    and the isend keeps the success it completed with."""
    if comm.rank == 1:
        comm.recv(np.empty(4), 0)
        comm.close()
        return None
    pending = comm.recv(np.empty(4), 1, async_op=True)
    sent = comm.send(np.arange(4.0), 1, async_op=True)
    seen = [sent.wait(timeout=60)]
    try:
        pending.wait(timeout=60)
        seen.append("received?")
    except Exception as e:          # noqa: BLE001 - the test checks the type
        seen.append(type(e).__name__)
    seen += [sent.wait(), sent.exception(), sent.is_completed()]
    return seen


class Interrupted(Exception):
    """What the alarm of _interrupting raises inside a blocked call."""


def _interrupting(call, after=1.0):
    """call() with SIGALRM raising Interrupted in it after `after` seconds; the name
    of what it raised (None if nothing)."""
    def ring(signum, frame):
        raise Interrupted()
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, after)
    try:
        call()
        return None
    except Exception as e:          # noqa: BLE001 - the test checks the type
        return type(e).__name__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def p2p_broken_halfway_spares_collectives(comm, n, folder):
    """Rank 0's blocking send larger than the channel is interrupted half-way (rank 1
    is not receiving yet); then rank 1's receive of it is interrupted half-way.  Sends
    and receives are refused after that on both ranks; collectives go on.  (The ranks
    take turns through files, which have no timeout.)"""
    r, seen = comm.rank, []
    sent_failed, recv_failed = os.path.join(folder, "sent"), os.path.join(folder, "received")
    if r == 1:
        _wait_for_file(sent_failed)
    seen.append(_interrupting(lambda: comm.send(np.ones(n), 1) if r == 0 else
                              comm.recv(np.empty(n), 0)))
    open(sent_failed if r == 0 else recv_failed, "w").close()
    _wait_for_file(recv_failed)
    seen.append(comm.allreduce(np.array([r + 1])).tolist())
    try:
        work = comm.send(np.ones(1), 1 - r, async_op=r == 1)
        if work is not None:
            work.wait()
        seen.append("sent after?")
    except Exception as e:          # noqa: BLE001
        seen.append(f"{type(e).__name__}: {e}")
    seen.append(comm.allgather(np.array([r])).tolist())
    return seen


def p2p_after_a_failed_collective(comm, folder):
    """Rank 0's allreduce is interrupted (rank 1 never calls it); a nonblocking send
    or receive after it must fail, not report a message that never moved."""
    done = os.path.join(folder, "done")
    if comm.rank == 1:
        _wait_for_file(done)
        return None
    seen = [_interrupting(lambda: comm.allreduce(np.ones(4)))]
    for call in (lambda: comm.send(np.ones(4), 1, async_op=True).wait(),
                 lambda: comm.recv(np.empty(4), 1, async_op=True).wait()):
        try:
            call()
            seen.append("no error")
        except Exception as e:      # noqa: BLE001 - the test checks the type
            seen.append(type(e).__name__)
    open(done, "w").close()
    return seen


def p2p_mismatches(comm):
    """A receive that expects another size or dtype: MismatchError on the receiver,
    the message discarded, the sender unaffected, and later messages arrive right."""
    P, r, seen = comm.world_size, comm.rank, {}
    nxt, prv = (r + 1) % P, (r - 1) % P
    for name, sent, expect in (("size", np.zeros(6), np.empty(5)),
                               ("dtype", np.zeros(4, np.float32), np.empty(4, np.int32))):
        comm.send(sent, nxt, tag=2)
        try:
            comm.recv(expect, prv, tag=2)
            seen[name] = None
        except MismatchError as e:
            seen[name] = (e.field, str(e))
    comm.send(np.full(3, r), nxt)
    seen["after"] = comm.recv(np.empty(3, np.int64), prv).tolist()
    seen["collective"] = float(comm.allreduce(np.ones(1))[0])
    return seen


def p2p_refusals(comm):
    P, seen = comm.world_size, {}
    for name, call in (("dst", lambda: comm.send(np.zeros(1), P)),
                       ("negative_tag", lambda: comm.send(np.zeros(1), 0, tag=-3)),
                       ("bool_rank", lambda: comm.send(np.zeros(1), True)),
                       ("objects", lambda: comm.send(np.array([object()]), 0)),
                       ("readonly", lambda: comm.recv(np.frombuffer(b"x" * 8), 0)),
                       # larger than the channel, to itself, blocking: it could never end
                       ("to_itself", lambda: comm.send(np.zeros(1 << 20), comm.rank))):
        try:
            call()
            seen[name] = None
        except (TypeError, ValueError) as e:
            seen[name] = type(e).__name__
    seen["after"] = comm.sendrecv(np.arange(3.0), comm.rank).tolist()
    # to itself, blocking, fits the channel but not the room the first one left
    room = settings.get("SHMCOLL_SLOTS") * settings.get("SHMCOLL_SLOT_BYTES") - 64
    half = np.full(room // 8 * 6 // 10, 2.0)
    comm.send(half, comm.rank, tag=1)
    try:
        comm.send(half + 1, comm.rank, tag=2)
        seen["second_to_itself"] = None
    except ValueError as e:
        seen["second_to_itself"] = "not received yet" in str(e)
    got = [comm.recv(np.empty_like(half), comm.rank, tag=1)]
    comm.send(half + 1, comm.rank, tag=2)    # the room is back
    got.append(comm.recv(np.empty_like(half), comm.rank, tag=2))
    seen["then"] = [float(g[0]) for g in got] + [float(g[-1]) for g in got]
    # a channel to itself filled to the last byte has no room even for an empty message
    full = np.full(room, 7, np.uint8)
    comm.send(full, comm.rank, tag=3)
    try:
        comm.send(np.empty(0), comm.rank, tag=4)
        seen["empty_when_full"] = None
    except ValueError as e:
        seen["empty_when_full"] = "room for 0 bytes" in str(e)
    seen["full"] = int(comm.recv(np.empty_like(full), comm.rank, tag=3).sum()) == 7 * room
    comm.send(np.empty(0), comm.rank, tag=4)
    seen["empty"] = comm.recv(np.empty(0), comm.rank, tag=4).shape
    return seen


def rhd_theorem(comm, m, dt):
    """allgather(reduce_scatter(x)) by rhd against the halving allreduce, bit for bit
    (both combine every element in the same order)."""
    P = comm.world_size
    rng = np.random.default_rng([11, comm.rank])
    x = rng.standard_normal(P * m).astype(dtype_of(dt))
    label = comm.algorithm_for("allreduce", x.nbytes, "rhd")
    full = comm.allreduce(x, algo="rhd")
    rs = comm.reduce_scatter(x, algo="rhd")
    split = comm.allgather(rs, algo="rhd").reshape(-1)
    return label, full.tobytes() == split.tobytes(), float(np.abs(full - x * 0).max())


def rhd_widened_reduce_scatter(comm, m, dt):
    """ReduceScatter by rhd of a type reduced in a wider accumulator (m elements per
    block), then a small allreduce: were the channels left in step?"""
    x = (np.arange(comm.world_size * m) % 5 + comm.rank).astype(dtype_of(dt))
    rs = comm.reduce_scatter(x, algo="rhd")
    after = comm.allreduce(np.array([comm.rank + 1], np.int64), algo="rhd")
    return rs, int(after[0])


def _recv_retrying(comm, out, src):
    """recv, waiting again after each TimeoutError (nothing half-received then)."""
    while True:
        try:
            return comm.recv(out, src)
        except Exception as e:      # noqa: BLE001 - only a timeout is retried
            if type(e).__name__ != "TimeoutError":
                raise


def p2p_failures(comm):
    """Rank 0: a receive that times out (rank 1 sends nothing before rank 0's
    go-ahead) leaves the communicator usable and the message arrives on a later
    receive; then a receive from a rank that closed without sending is PeerLostError."""
    if comm.rank == 1:
        _recv_retrying(comm, np.empty(1), 0)       # go-ahead: rank 0 timed out
        comm.send(np.arange(2.0), 0)
        _recv_retrying(comm, np.empty(1), 0)       # rank 0 got it: close
        comm.close()
        return None
    seen = []
    try:
        comm.recv(np.empty(2), 1)
    except Exception as e:          # noqa: BLE001 - the test checks the type
        seen.append(type(e).__name__)
    comm.send(np.zeros(1), 1)
    seen.append(_recv_retrying(comm, np.empty(2), 1).tolist())
    comm.send(np.zeros(1), 1)
    try:
        _recv_retrying(comm, np.empty(2), 1)
    except Exception as e:          # noqa: BLE001
        seen.append(type(e).__name__)
    return seen
