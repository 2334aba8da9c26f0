"""Rank functions of test_nonblocking (module level, so spawned ranks import them)."""
import os
import time

import numpy as np

import shmcoll
from shmcoll.tools.harness import in_place, invoke
from workers import _case_inputs, _outcome, _wait_for_file


def _issue(comm, case, async_op):
    """One case of reference.expected_result issued on this rank: (call, out_copy)
    where call is its Work (async_op) or its result."""
    collective, shape, dt, op, inplace, algo, seed, root = case
    x, out = _case_inputs(comm, collective, shape, dt, op, seed, root)
    if inplace:
        if collective in ("allgather", "gather"):
            out = np.empty((comm.world_size,) + tuple(shape), x.dtype)
        x, out = in_place(comm, collective, x, out, root)
    return invoke(comm, collective, x, out, op, root, algo, async_op=async_op)


def run_cases_async(comm, cases, window=48, blocking_every=0):
    """Every case issued with async_op=True, up to `window` outstanding at once and
    waited for in reverse order of issue (completion is in issue order whatever the
    waiting order); every `blocking_every`-th case (when non-zero) is a blocking call
    among them.  Returns each case's result."""
    results, pending = [None] * len(cases), []

    def settle():
        for i, work in reversed(pending):
            got = work.wait()
            results[i] = None if got is None else got.copy()
        pending.clear()

    for i, case in enumerate(cases):
        if blocking_every and i % blocking_every == blocking_every - 1:
            got = _issue(comm, case, False)
            results[i] = None if got is None else got.copy()
        else:
            pending.append((i, _issue(comm, case, True)))
        if len(pending) >= window:
            settle()
    settle()
    return results


def ordered_values(comm, n):
    """n allreduces of distinct values outstanding at once, then a blocking one; the
    works are waited for last-issued first."""
    works = [comm.allreduce(np.full(257 + i, comm.rank * 1000 + i, np.int64), async_op=True)
             for i in range(n)]
    last = comm.allreduce(np.full(3, comm.rank, np.int64))
    states = [w.is_completed() for w in works]     # the blocking call ran after all
    return [int(w.wait()[0]) for w in reversed(works)][::-1], last.tolist(), states


def mismatch_then_more(comm):
    """Rank r's first allreduce has 10 + r elements; two more calls are queued behind
    it, then a blocking barrier.  Returns the outcome of each."""
    works = [comm.allreduce(np.ones(10 + comm.rank, np.float32), async_op=True),
             comm.broadcast(np.ones(4, np.int32), root=0, async_op=True),
             comm.barrier(async_op=True)]
    outcomes = [_outcome(w.wait) for w in works]
    errors = [type(w.exception()).__name__ for w in works]
    return outcomes, errors, _outcome(comm.barrier)


def timeout_in_wait(comm):
    """Rank 0 queues an allreduce rank 1 never makes: wait(timeout=...) expires with the
    work still outstanding, then the call's own timeout fails it."""
    if comm.rank != 0:
        time.sleep(4)
        return None
    w = comm.allreduce(np.ones(4), async_op=True)
    short = _outcome(lambda: w.wait(timeout=0.05))
    running = (w.is_completed(), w.exception())
    final = _outcome(w.wait)
    return short, running, final, w.is_completed(), type(w.exception()).__name__


def close_with_outstanding(comm, n):
    """Queue n allreduces and close without waiting: close waits for them."""
    works = [comm.allreduce(np.full(1 << 12, i + comm.rank, np.float64), async_op=True)
             for i in range(n)]
    comm.close()
    return comm.closed, [float(w.wait()[0]) for w in works], [w.is_completed() for w in works]


def fail_with_outstanding(comm, flag):
    """Rank 0 queues an allreduce rank 1 makes only once `flag` exists, and more calls
    behind it, then leaves through an exception (the communicator's __exit__ fails
    it): every queued work fails with ClosedError at once; rank 1 sees rank 0 gone."""
    if comm.rank != 0:
        _wait_for_file(flag)
        return _outcome(lambda: comm.allreduce(np.ones(4)))[0]
    works = [comm.allreduce(np.ones(4), async_op=True) for _ in range(3)]
    try:
        with comm:
            raise RuntimeError("a failure of this rank")
    except RuntimeError:
        pass
    open(flag, "w").close()
    return [type(w.exception()).__name__ for w in works], comm.closed


def progress_while_computing(comm, flag, limit_s=120):
    """Rank 0 queues an allreduce and then computes in pure Python, holding the GIL,
    until rank 1 says (flag) its blocking allreduce returned: that can only happen if
    rank 0's progress thread ran the call without rank 0's help."""
    x = np.arange(1 << 16, dtype=np.float32)
    if comm.rank != 0:
        got = comm.allreduce(x)
        open(flag, "w").close()
        return bool(np.array_equal(got, 2 * x))
    work = comm.allreduce(x, async_op=True)
    deadline, spins = time.monotonic() + limit_s, 0
    while not os.path.exists(flag) and time.monotonic() < deadline:
        spins += sum(range(1000))          # holds the GIL
    seen = os.path.exists(flag)
    return seen, bool(np.array_equal(work.wait(), 2 * x))


def submit_while_blocking_elsewhere(comm, flag):
    """While a thread of rank 0 is inside a blocking allreduce (rank 1 joins it only
    once `flag` exists), a nonblocking call from the main thread is refused."""
    from workers import _in_thread, _until_inside
    x = np.ones(8, np.float32)
    if comm.rank != 0:
        _wait_for_file(flag)
        comm.allreduce(x)
        return None
    t, box = _in_thread(lambda: comm.allreduce(x))
    _until_inside(comm, t)
    refused = _outcome(lambda: comm.allreduce(x, async_op=True))
    open(flag, "w").close()
    t.join()
    return refused[0], box["result"]


def errors_at_issue(comm):
    """Bad arguments raise in the caller, before anything is queued: the next calls
    still match on every rank."""
    bad = [lambda: comm.allreduce(np.ones(3, np.float32), op="band", async_op=True),
           lambda: comm.reduce_scatter(np.ones(comm.world_size + 1), async_op=True),
           lambda: comm.broadcast(np.ones(3)[::2], async_op=True),
           lambda: comm.gather(np.ones(3), root=comm.world_size, async_op=True),
           lambda: comm.allreduce(np.ones(3), out=np.ones(4), async_op=True)]
    kinds = [_outcome(b)[0] for b in bad]
    good = comm.allreduce(np.ones(3), async_op=True).wait()
    return kinds, good.tolist(), comm._engine.outstanding


def fork_with_outstanding(comm):
    """A forked child's copy of a communicator with queued works: they fail there with
    ClosedError at once; the parent's complete."""
    import multiprocessing as mp
    works = [comm.allreduce(np.ones(1 << 14), async_op=True) for _ in range(4)]
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(["running" if not w.is_completed() else
               type(w.exception()).__name__ if w.exception() else "done" for w in works])
    p = ctx.Process(target=child)
    p.start()
    in_child = q.get(timeout=60)
    p.join(60)
    return in_child, [float(w.wait()[0]) for w in works]


def wait_all_results(comm):
    works = [comm.allreduce(np.full(5, i, np.int32), async_op=True) for i in range(6)]
    works.append(comm.barrier(async_op=True))
    return [None if r is None else int(r[0]) for r in shmcoll.wait_all(works, timeout=120)]


def run_device_cases_async(comm, cases):
    """Device-array cases issued with async_op=True, then waited for in reverse order:
    each Work is a point of the stream; numpy results as workers.run_device_case."""
    from shmcoll.cuda import array_converters
    dev, to_host = array_converters()
    works = []
    for collective, shape, dt, op, inplace, algo, seed, root in cases:
        x, out = _case_inputs(comm, collective, shape, dt, op, seed, root, dev)
        if inplace and collective == "allreduce":
            out = x
        works.append(invoke(comm, collective, x, out, op, root, algo, async_op=True))
    assert all(isinstance(w, shmcoll.Work) for w in works)
    got = [w.wait() for w in reversed(works)][::-1]
    return [None if g is None else to_host(g) for g in got]


def cupy_async_allreduce(comm):
    """A device allreduce issued with async_op=True on a side stream: wait() is
    synchronising with it (a GPU run only)."""
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.full(1 << 22, comm.rank + 1, cupy.float32)
        work = comm.allreduce(x, async_op=True)
    y = work.wait()
    P = comm.world_size
    return bool(work.is_completed()) and bool((y == P * (P + 1) // 2).all())


def two_threads_issue_and_wait(comm, n):
    """Two threads issue n identical allreduces each at once (the progress thread
    started by whichever comes first), then each waits for the other's works.  Every
    result must be right; the calls pair up across ranks in whatever order they were
    queued, which is why they are identical."""
    import threading
    works = {0: [], 1: []}
    go = threading.Barrier(2)

    def issue(k):
        go.wait()
        for _ in range(n):
            works[k].append(comm.allreduce(np.ones(1000, np.float32), async_op=True))

    def wait_for(k, box):
        box[k] = [float(w.wait()[0]) for w in works[1 - k]]

    for target, boxes in ((issue, None), (wait_for, {})):
        threads = [threading.Thread(target=target, args=(k,) if boxes is None else (k, boxes))
                   for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return boxes[0] + boxes[1]


class _Alarm(Exception):
    pass


def signal_during_wait(comm, flag):
    """A signal handler that raises ends rank 0's wait() (the call stays queued); rank 1
    joins the call only after that, and a second wait() gets the result."""
    import signal
    x = np.ones(8, np.float32)
    if comm.rank != 0:
        _wait_for_file(flag)
        return comm.allreduce(x).tolist()

    def handler(*_):
        raise _Alarm()
    signal.signal(signal.SIGALRM, handler)
    work = comm.allreduce(x, async_op=True)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    interrupted = _outcome(work.wait)[0]
    still_running = not work.is_completed()
    open(flag, "w").close()
    return interrupted, still_running, work.wait().tolist()
