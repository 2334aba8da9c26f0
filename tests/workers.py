"""Functions that run on every rank (module level, so spawned ranks can import them)."""
import os
import signal
import time

import numpy as np

from reference import dtype_of, make_input
from shmcoll.tools.harness import in_place, invoke


def _case_inputs(comm, collective, shape, dtype_name, op, seed, root, to=lambda a: a):
    """(x, out) of a case on this rank: its deterministic input (broadcast: the root's,
    zeros elsewhere; scatter: the root's stack of every rank's, and receive buffers
    elsewhere), `to` applied to every array (device arrays)."""
    P, r = comm.world_size, comm.rank
    if collective == "broadcast":
        buf = make_input(root, shape, dtype_name, op, seed) if r == root else \
            np.zeros(shape, dtype_of(dtype_name))
        return to(buf), None
    if collective == "scatter":
        if r != root:
            return None, to(np.empty(shape, dtype_of(dtype_name)))
        return to(np.stack([make_input(q, shape, dtype_name, op, seed) for q in range(P)])), None
    if collective == "alltoall":
        return to(make_input(r, (P,) + tuple(shape), dtype_name, op, seed)), None
    return to(make_input(r, shape, dtype_name, op, seed)), None


def run_case(comm, collective, shape, dtype_name, op, inplace, algo=None, seed=0, root=0):
    """Run one collective on this rank's deterministic input; return the result
    (reference.expected_result says what it must be)."""
    x, out = _case_inputs(comm, collective, shape, dtype_name, op, seed, root)
    if inplace:
        if collective in ("allgather", "gather"):
            out = np.empty((comm.world_size,) + tuple(shape), x.dtype)
        x, out = in_place(comm, collective, x, out, root)
    got = invoke(comm, collective, x, out, op, root, algo)
    return None if got is None else got.copy()


def run_cases(comm, cases):
    return [run_case(comm, *case) for case in cases]


def algorithm_labels(comm, calls):
    """What each (collective, priced bytes, algo) runs here (Communicator.algorithm_for)."""
    return [comm.algorithm_for(*call) for call in calls]


def inline_nonblocking(comm, n, count=3):
    """n nonblocking AllReduces, AllGathers and Broadcasts of `count` elements (3: each
    rank's part in its call record; a thousand: in its part buffers, whose two parities
    are reused every other call) queued at once, waited in reverse; the wrong results."""
    P, r = comm.world_size, comm.rank
    calls = []
    for i in range(n):
        x = np.arange(count, dtype=np.int32) + i * (r + 1)
        b = np.full(count, i if r == i % P else -1, np.float64)
        calls.append((i, comm.allreduce(x, async_op=True), comm.allgather(x, async_op=True),
                      comm.broadcast(b, i % P, async_op=True), b))
    wrong = []
    rows = lambda i: np.stack([np.arange(count, dtype=np.int32) + i * (q + 1) for q in range(P)])
    for i, red, gat, bc, b in reversed(calls):
        if not np.array_equal(red.wait(), rows(i).sum(axis=0, dtype=np.int32)):
            wrong.append(("allreduce", i))
        if not np.array_equal(gat.wait(), rows(i)):
            wrong.append(("allgather", i))
        bc.wait()
        if not np.array_equal(b, np.full(count, i, np.float64)):
            wrong.append(("broadcast", i))
    return wrong


def rank_and_size(comm):
    return comm.rank, comm.world_size


def allreduce_sum_of_rank(comm):
    x = np.arange(10, dtype=np.float32) * (comm.rank + 1)
    return float(comm.allreduce(x).sum())


def raise_on(comm, bad_rank):
    if comm.rank == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {comm.rank}")
    comm.allreduce(np.ones(4, np.float32))     # peers block until the job is aborted
    return "finished"


def kill_self_on(comm, bad_rank):
    if comm.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.allreduce(np.ones(1 << 20, np.float32))
    return "finished"


def large_allreduce_check(comm, count, dtype_name):
    """Large message: check every element in place on the rank, return wrong count."""
    x = np.full(count, comm.rank + 1, dtype=dtype_of(dtype_name))
    x[::4097] = 2 * (comm.rank + 1)
    y = comm.allreduce(x)
    P = comm.world_size
    want = np.full(count, P * (P + 1) // 2, dtype=y.dtype)
    want[::4097] = P * (P + 1)
    return int(np.count_nonzero(y != want))


def call_after_close(comm):
    comm.close()
    try:
        comm.allreduce(np.ones(3))
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        return type(e).__name__, str(e)
    return None


def expect_error(comm, method, args, kwargs):
    """Call a collective that must fail locally; return (exception type, message)."""
    try:
        getattr(comm, method)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return type(e).__mro__[0].__name__, [c.__name__ for c in type(e).__mro__], str(e)
    return None


def sleep_then_allreduce(comm, sleeper, seconds):
    if comm.rank == sleeper:
        time.sleep(seconds)
    return comm.allreduce(np.ones(8, np.float32)).tolist()


def float_sum_random(comm, count, dtype_name, seed):
    rng = np.random.default_rng([seed, comm.rank])
    x = rng.standard_normal(count).astype(dtype_name)
    return x, comm.allreduce(x)


def random_allreduce_every_way(comm, count, dtype_name, op, algo, seed):
    """One allreduce of random floats (where summation order changes the bits) out
    of place, then in place: (x, out of place, in place)."""
    rng = np.random.default_rng([seed, comm.rank])
    x = rng.standard_normal(count).astype(dtype_name)
    apart = comm.allreduce(x, op=op, algo=algo)
    inplace = x.copy()
    comm.allreduce(inplace, out=inplace, op=op, algo=algo)
    return x, apart, inplace


def _read_only_out():
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    return "allreduce", (np.zeros(8, np.float32),), {"out": ro}


def _partial_overlap():
    buf = np.zeros(16, np.float32)
    return "allreduce", (buf[:8],), {"out": buf[4:12]}


def _strided_out():
    return "allreduce", (np.zeros(8, np.float32),), {"out": np.zeros(16, np.float32)[::2]}


def _big_endian_input():
    return "allreduce", (np.arange(4, dtype=">f4"),), {}


# Calls whose arguments must be built on the rank: pickling would make them
# contiguous, writeable and native-endian copies on the way.
def _strided_broadcast():
    return "broadcast", (np.zeros(8, np.float32)[::2],), {}


def _read_only_broadcast():
    x = np.zeros(4)
    x.flags.writeable = False
    return "broadcast", (x,), {}


LOCAL_BAD_CALLS = {
    "strided_broadcast": _strided_broadcast,
    "read_only_broadcast": _read_only_broadcast,
    "read_only_out": _read_only_out,
    "partial_overlap": _partial_overlap,
    "strided_out": _strided_out,
    "big_endian_input": _big_endian_input,
}


def expect_local_error(comm, name):
    method, args, kwargs = LOCAL_BAD_CALLS[name]()
    return expect_error(comm, method, args, kwargs)


def cpu_while_waiting(comm, sleeper, seconds):
    """CPU seconds this rank spent inside an allreduce that waited `seconds` for `sleeper`."""
    x = np.ones(16, np.float32)
    comm.allreduce(x)
    if comm.rank == sleeper:
        time.sleep(seconds)
    cpu0, wall0 = time.process_time(), time.monotonic()
    comm.allreduce(x)
    return time.process_time() - cpu0, time.monotonic() - wall0


def other_thread_runs_while_waiting(comm, sleeper, seconds):
    """Ticks of a pure-Python loop in a second thread: first while this rank sleeps
    `seconds` (the baseline), then while a small allreduce, then a barrier, wait
    `seconds` for `sleeper`.  Returns (baseline, [ticks per call])."""
    import threading
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    x = np.ones(2, np.float32)
    comm.allreduce(x)
    counter = threading.Thread(target=count)
    counter.start()
    counts = []
    try:
        before = ticks[0]
        time.sleep(seconds)
        baseline = ticks[0] - before
        for call in (lambda: comm.allreduce(x), comm.barrier):
            if comm.rank == sleeper:
                time.sleep(seconds)
            before = ticks[0]
            call()
            counts.append(ticks[0] - before)
    finally:
        stop.set()
        counter.join()
    return baseline, counts


def late_for_a_call_given_up(comm, algo, flag):
    """Every rank but the last times out in an allreduce the last rank makes only once
    `flag` exists (rank 0 creates it after its TimeoutError, and after a next call its
    broken communicator refuses).  The others had already written their part, so the
    last rank could finish the call: it must fail it instead (PeerLostError), not return
    a result of a call its peers report as failed."""
    x = np.ones(4, np.float32)
    last = comm.world_size - 1
    if comm.rank == last:
        _wait_for_file(flag)
        return _outcome(lambda: comm.allreduce(x, algo=algo)), None
    outcome = _outcome(lambda: comm.allreduce(x, algo=algo))
    refused = _outcome(lambda: comm.allreduce(x, algo=algo))[0]
    if comm.rank == 0:
        open(flag, "w").close()
    return outcome, refused


def late_for_a_call_closed_under_it(comm, algo, flag):
    """A thread of rank 0 is inside an allreduce (its part written, the last rank not
    there yet) when rank 0's main thread closes the communicator: the call gives up
    with ClosedError.  Then the last rank comes (once `flag` exists) and finds rank 0's
    part written: it must raise PeerLostError, not return a result."""
    x = np.ones(4, np.float32)
    if comm.rank == comm.world_size - 1:
        _wait_for_file(flag)
        return _outcome(lambda: comm.allreduce(x, algo=algo))
    if comm.rank != 0:
        return _outcome(lambda: comm.allreduce(x, algo=algo))
    t, box = _in_thread(lambda: comm.allreduce(x, algo=algo))
    _until_inside(comm, t)
    time.sleep(0.05)        # (lets it write its part: the case where the late rank could finish)
    comm.close()
    t.join()
    open(flag, "w").close()
    return box["result"][0], None, box["result"][1]


def late_calls_then_close(comm, collective, rounds, late):
    """`rounds` calls of `collective` (barrier or a small allreduce), each with one
    rank, in turn, `late` seconds late, while a second thread of every rank keeps the
    cores busy; then the rank returns and closes at once.  The peers still waking
    from their last call find it closed: they must count what it wrote before."""
    import threading
    stop = threading.Event()

    def keep_a_core_busy():
        while not stop.is_set():
            pass

    x = np.full(2, comm.rank + 1.0, np.float32)
    busy = threading.Thread(target=keep_a_core_busy)
    busy.start()
    try:
        for i in range(rounds):
            if comm.rank == i % comm.world_size:
                time.sleep(late)
            y = comm.barrier() if collective == "barrier" else comm.allreduce(x)
    finally:
        stop.set()
        busy.join()
    return y if y is None else y.tolist()


def allreduce_loop(comm, count, iters):
    x = np.full(count, comm.rank + 1.0, np.float32)
    cpu0, wall0 = time.process_time(), time.monotonic()
    for _ in range(iters):
        y = comm.allreduce(x)
    P = comm.world_size
    ok = bool(np.all(y == P * (P + 1) / 2))
    return ok, time.process_time() - cpu0, time.monotonic() - wall0


def chosen_algorithms(comm):
    """The algorithms the communicator picks for a small and a large allreduce."""
    return [comm.algorithm_for("allreduce", n).split(" ")[0] for n in (8, 64 << 20)]


def _call(comm, spec):
    """One call described by (kind, count, dtype, op, algo[, root]); a count of -1 is
    a 0-d array."""
    kind, count, dtype, op, algo = spec[:5]
    root = spec[5] if len(spec) > 5 else 0
    if kind == "sleep":
        return time.sleep(count / 1000)
    x = np.ones(count, dtype) if count >= 0 else np.ones((), dtype)
    out = None
    if kind == "reduce_scatter":
        x = np.ones(count * comm.world_size, dtype)
    elif kind == "scatter":
        x = np.ones((comm.world_size, count), dtype) if comm.rank == root else None
        out = np.empty(count, dtype)
    elif kind == "alltoall":
        x = np.ones((comm.world_size, count), dtype)
    return invoke(comm, kind, x, out, op, root, algo)


def _outcome(call):
    try:
        call()
        return ("ok", None, None)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return (type(e).__name__, getattr(e, "field", None), str(e))


def call_sequences(comm, job, cases, timeout=20):
    """For each case (one list of calls per rank), a fresh communicator of this job's
    ranks (joined by name) on which rank r makes the calls of its list in order.
    Returns, per case, the outcome of each of this rank's calls."""
    import shmcoll
    os.environ["SHMCOLL_JOIN_GRACE"] = "0"     # one job per name here: formation is not the test
    results = []
    for i, per_rank in enumerate(cases):
        sub = shmcoll.init(rank=comm.rank, world_size=comm.world_size, job=f"{job}-{i}",
                           timeout=timeout)
        with sub:
            results.append([_outcome(lambda: _call(sub, spec)) for spec in per_rank[comm.rank]])
        comm.barrier()
    return results


def mismatched_calls(comm, specs):
    """Rank r makes the call specs[r], then a barrier; returns what each raised."""
    outcome = []
    for call in (lambda: _call(comm, specs[comm.rank]), comm.barrier):
        try:
            call()
            outcome.append(("ok", None, None))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome.append((type(e).__name__, getattr(e, "field", None), str(e)))
    return outcome


def use_in_forked_child(comm):
    """The parent keeps working; a forked child's use of the communicator is refused."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            comm.allreduce(np.ones(4, np.float32))
            q.put("no error")
        except Exception as e:  # noqa: BLE001
            q.put(f"{type(e).__name__}: {e}")

    p = ctx.Process(target=child)
    p.start()
    message = q.get(timeout=30)
    p.join()
    return message, float(comm.allreduce(np.ones(4, np.float32)).sum())


from shmcoll.collectives import NAMES as SOAK_COLLECTIVES  # noqa: E402


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(comm, n_ops, seed, max_bytes):
    """n_ops random collectives, the same sequence on every rank; each result is
    checked here against numpy.  Returns (wrong, peak rss of the first half, peak rss of
    the second half): a leak grows with the number of calls, malloc's high-water mark
    does not."""
    from reference import ALL_DTYPES, bitwise_equal, dtype_of, expected_result, ops_for
    from shmcoll.tuning.selector import algorithms_for
    rng = np.random.default_rng(seed)
    P, r = comm.world_size, comm.rank
    wrong, peaks = [], [0, 0]
    for i in range(n_ops):
        half = 2 * i // n_ops
        peaks[half] = max(peaks[half], _rss_bytes())
        coll = SOAK_COLLECTIVES[rng.integers(len(SOAK_COLLECTIVES))]
        dt = ALL_DTYPES[rng.integers(len(ALL_DTYPES))]
        op = ops_for(dt)[rng.integers(len(ops_for(dt)))]
        itemsize = dtype_of(dt).itemsize
        count = int(np.exp(rng.uniform(0, np.log(max_bytes // itemsize))))
        if coll == "reduce_scatter":
            count = max(P, count - count % P)
        algos = [None] + algorithms_for(coll)
        algo = algos[rng.integers(len(algos))]
        case = (coll, (count,), dt, op, bool(rng.integers(2)), algo, i, int(rng.integers(P)))
        got = run_case(comm, *case)
        if not bitwise_equal(got, expected_result(case, P, r)):
            wrong.append(case[:4])
    return wrong, peaks[0], max(peaks[1], _rss_bytes())


def ring_stress(comm, n_messages, seed, max_bytes):
    """Two ranks exchange n_messages of random sizes through allgather; every byte of
    the peer's message is verified.  Returns the number of bad messages."""
    rng = np.random.default_rng(seed)
    peer = 1 - comm.rank
    bad = 0
    for i in range(n_messages):
        n = int(rng.integers(0, max_bytes + 1))
        mine = np.full(n, (i * 7 + comm.rank * 13) & 0xFF, np.uint8)
        res = comm.allgather(mine)
        expect = (i * 7 + peer * 13) & 0xFF
        if n and not (res[peer] == expect).all():
            bad += 1
    return bad


def refused_calls_leave_out_untouched(comm):
    """Calls refused for their arguments must not have written anything to `out`."""
    out = np.full(8, 7, np.int32)
    refused = [
        lambda: comm.allreduce(np.ones(8, np.float32), out=np.full(8, 7.0, np.float32), op="band"),
        lambda: comm.allreduce(np.ones(8, np.int32), out=out, op="median"),
        lambda: comm.allreduce(np.ones(8, np.int32), out=out, algo="butterfly"),
        lambda: comm.allreduce(np.ones(8, np.int64), out=out),
        lambda: comm.reduce_scatter(np.ones(8 * comm.world_size + 1, np.int32), out=out),
        lambda: comm.allgather(np.ones(8, np.int32), out=out),
    ]
    errors = 0
    for call in refused:
        try:
            call()
        except (TypeError, ValueError):
            errors += 1
    return errors, bool((out == 7).all())


THEOREM1_BITWISE = {("ring", "ring"), ("direct", "direct"), ("naive", "direct")}


def theorem1(comm, cases, m):
    """For each (dtype, op): allreduce(x) by every algorithm, and
    allgather(reduce_scatter(x)) by ring and by direct, on random inputs of
    world_size * m elements (so the orders of summation differ between algorithms)."""
    from reference import dtype_of
    from shmcoll.tuning.selector import algorithms_for
    P, out = comm.world_size, []
    for dt, op in cases:
        rng = np.random.default_rng([7, comm.rank, len(dt), len(op)])
        if np.dtype(dtype_of(dt)).kind == "f" or dt == "bfloat16":
            x = rng.standard_normal(P * m).astype(dtype_of(dt))
        else:
            x = rng.integers(-100, 100, P * m).astype(dtype_of(dt))
        full = {a: comm.allreduce(x, op=op, algo=a) for a in algorithms_for("allreduce")}
        split = {a: comm.allgather(comm.reduce_scatter(x, op=op, algo=a), algo=a).reshape(-1)
                 for a in ("ring", "direct")}
        out.append((full, split))
    return out


def two_decisions(comm):
    """An automatic allreduce and broadcast (what SHMCOLL_DEBUG=INFO logs)."""
    comm.allreduce(np.ones(1024, np.float32))
    comm.broadcast(np.ones(3))


def run_device_case(comm, collective, shape, dtype_name, op, inplace, algo=None, seed=0, root=0):
    """run_case on device arrays (CuPy's, or stand-ins with SHMCOLL_CUDA_BACKEND=host);
    returns numpy results like run_case (in place: allreduce only)."""
    from shmcoll.cuda import array_converters
    dev, to_host = array_converters()
    x, out = _case_inputs(comm, collective, shape, dtype_name, op, seed, root, dev)
    if inplace and collective == "allreduce":
        out = x
    got = invoke(comm, collective, x, out, op, root, algo)
    return None if got is None else to_host(got)


def run_device_cases_one_slow(comm, cases, slow_rank, delay):
    """run_device_cases with one rank reading late (the host stand-in's read_delay)."""
    from shmcoll.cuda import backend
    backend.load().read_delay = delay if comm.rank == slow_rank else 0.0
    return run_device_cases(comm, cases)


def run_device_cases(comm, cases):
    comm.barrier()
    out = [run_device_case(comm, *case) for case in cases]
    comm.synchronize()
    return out


def device_call_error(comm, method, kwargs_by_rank):
    """Each rank calls method(**kwargs_by_rank[rank]) on HostArrays built from numpy
    arrays; returns (exception type, message) or None."""
    from shmcoll.cuda.host import HostArray
    kwargs = {k: HostArray(v) if isinstance(v, np.ndarray) else v
              for k, v in kwargs_by_rank[comm.rank].items()}
    try:
        getattr(comm, method)(**kwargs)
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        return type(e).__name__, str(e)
    return None


def device_setup_then_close(comm):
    """Set the device buffers up, close, and report this rank's mappings left open."""
    from shmcoll.cuda.host import HostArray
    comm.allreduce(HostArray(np.ones(4, np.float32)))
    backend = comm._device_path.backend
    comm.close()
    return len(backend._maps)


def float_sum_random_device(comm, count, dtype_name, seed):
    """Random floats summed one-shot, two-shot and by ring on device stand-ins."""
    from shmcoll.cuda.host import HostArray
    rng = np.random.default_rng([seed, comm.rank])
    x = HostArray(rng.standard_normal(count).astype(dtype_name))
    return [_forced_variant(comm, x, "one_shot"), _forced_variant(comm, x, "two_shot"),
            comm.allreduce(x, algo="ring").host.copy()]


def _forced_variant(comm, x, schedule):
    """One direct AllReduce variant, forced (algo= names algorithms, not variants)."""
    from shmcoll.cuda.host import HostArray
    from shmcoll.cuda.path import DeviceArray
    path = comm._device()
    out = HostArray(np.empty(x.shape, x.dtype))
    xa = DeviceArray(x, "x")
    from shmcoll.ops import ReduceOp
    _, stream = path._begin("allreduce", xa, ReduceOp.SUM.code, 0, "direct", xa.nbytes)
    getattr(path.sched, schedule)(DeviceArray(out, "out"), xa, xa.dtype, "sum", stream)
    return out.host.copy()


def device_backend_error(comm):
    """A device call's DeviceError message, or None if it ran."""
    import shmcoll
    from shmcoll.cuda.host import HostArray
    try:
        comm.allreduce(HostArray(np.ones(2, np.float32)))
    except shmcoll.DeviceError as e:
        return str(e)
    return None


def cpu_allreduce_imports(comm):
    import sys
    return float(comm.allreduce(np.ones(3)).sum()), "cupy" in sys.modules


def device_algorithm_for(comm, queries):
    """comm.algorithm_for(..., device=True) per (collective, nbytes, algo), or the error."""
    out = []
    for coll, nbytes, algo in queries:
        try:
            out.append(comm.algorithm_for(coll, nbytes, algo, device=True))
        except ValueError as e:
            out.append(f"ValueError: {e}")
    return out


def cupy_large_allreduce(comm, nbytes):
    """Every algorithm on nbytes of float32 on the GPU; (wrong elements, digest)."""
    import cupy
    import hashlib
    count = nbytes // 4
    x = cupy.full(count, comm.rank + 1, dtype=cupy.float32)
    wrong, digest = 0, hashlib.sha1()
    P = comm.world_size
    for algo in ("direct", "ring", None):
        y = comm.allreduce(x, algo=algo)
        wrong += int(cupy.count_nonzero(y != P * (P + 1) // 2))
        digest.update(cupy.asnumpy(y[:1024]).tobytes())
    comm.synchronize()
    return wrong, digest.hexdigest()


def cupy_stream_order(comm):
    """A collective on a non-default stream sees the kernel enqueued before it there."""
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.zeros(1 << 20, cupy.float32)
        cupy.cuda.runtime.streamSynchronize(stream.ptr)
        x += comm.rank + 1            # enqueued on `stream`, before the allreduce
        y = comm.allreduce(x)
        ok = bool((y == comm.world_size * (comm.world_size + 1) // 2).all())
    comm.synchronize()
    return ok


def typed_broadcasts(comm, job, cases):
    """Per case, rank r broadcasts (root 0) an array of dtype cases[i][r] holding 8
    bytes; returns (outcome, received bytes) per case."""
    import shmcoll
    os.environ["SHMCOLL_JOIN_GRACE"] = "0"
    results = []
    for i, dtypes in enumerate(cases):
        dt = np.dtype(dtypes[comm.rank])
        nbytes = 8
        raw = np.arange(nbytes, dtype=np.uint8) + 1 if comm.rank == 0 else np.zeros(nbytes, np.uint8)
        x = raw.view(dt) if nbytes % dt.itemsize == 0 else raw[:dt.itemsize].view(dt)
        with shmcoll.init(rank=comm.rank, world_size=comm.world_size, job=f"{job}-{i}",
                          timeout=20) as sub:
            outcome = _outcome(lambda: sub.broadcast(x, root=0))
        results.append((outcome, x.view(np.uint8).tolist()))
        comm.barrier()
    return results


def _in_thread(fn):
    """Start fn in a thread; returns (thread, box) where box["result"] gets its outcome."""
    import threading
    box = {}

    def run():
        try:
            box["result"] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the test inspects it
            box["result"] = (type(e).__name__, str(e))
    t = threading.Thread(target=run)
    t.start()
    return t, box


def _until_inside(comm, thread, limit_s=60):
    """Until `thread`'s call is inside the engine (it waits there for a late peer)."""
    deadline = time.monotonic() + limit_s
    while not comm._engine.in_call:
        assert thread.is_alive() and time.monotonic() < deadline, "the call never started"
        time.sleep(0.001)


def _wait_for_file(path, limit_s=60):
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.002)


def second_thread_enters(comm, flag):
    """Thread A of rank 0 is inside an allreduce (rank 1 joins only once `flag`
    exists) when rank 0's main thread calls: the main thread's call is refused, A's
    completes."""
    x = np.ones(4, np.float32)
    if comm.rank != 0:
        _wait_for_file(flag)
        return comm.allreduce(x).tolist(), None
    t, box = _in_thread(lambda: comm.allreduce(x).tolist())
    _until_inside(comm, t)
    second = _outcome(lambda: comm.allreduce(x))
    open(flag, "w").close()
    t.join()
    return box["result"], second


def two_threads_hammer(comm, calls, count=1000):
    """Two threads per rank call allreduce on one communicator as fast as they can:
    thread k of rank r sends (r + 1) * 1000**k, so any result of a correct pairing of
    threads across ranks is one of a few sums, and anything else (torn, mixed or
    stale data) is wrong.  A refused call (ConcurrentCallError) is retried, so every
    thread completes `calls` calls and the ranks' call counts match.
    Returns (right results, wrong results, error type names)."""
    import itertools
    import threading
    import shmcoll
    P = comm.world_size
    valid = {float(sum((r + 1) * 1000 ** k for r, k in enumerate(choice)))
             for choice in itertools.product((0, 1), repeat=P)}
    tally = {"right": 0, "wrong": 0, "errors": set()}
    lock = threading.Lock()

    def hammer(k):
        x = np.full(count, (comm.rank + 1) * 1000 ** k, np.float64)
        done = 0
        while done < calls:
            try:
                y = comm.allreduce(x)
            except shmcoll.ConcurrentCallError:
                time.sleep(0)
                continue
            except Exception as e:  # noqa: BLE001
                with lock:
                    tally["errors"].add(type(e).__name__)
                return
            done += 1
            ok = bool(np.all(y == y[0])) and float(y[0]) in valid
            with lock:
                tally["right" if ok else "wrong"] += 1
    threads = [threading.Thread(target=hammer, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally["right"], tally["wrong"], sorted(tally["errors"])


def close_during_call(comm, algo, flag):
    """Rank 0 closes its communicator from the main thread while thread A is inside an
    allreduce that waits for rank 1 (which calls only once `flag` exists).  Returns
    rank 0's (A's outcome, whether A had left when close() returned, closed); rank
    1's outcome."""
    x = np.ones(1 << 16, np.float32)
    if comm.rank != 0:
        _wait_for_file(flag)
        res = _outcome(lambda: comm.allreduce(x, algo=algo))
        return res[0], res[0] != "ok" or None
    t, box = _in_thread(lambda: comm.allreduce(x, algo=algo))
    _until_inside(comm, t)
    comm.close()
    left = not t.is_alive()
    open(flag, "w").close()
    t.join()
    return box["result"], left, comm.closed


def close_from_signal_handler(comm, flag):
    """A SIGALRM handler closes the communicator while this very thread waits in a
    collective (rank 1 calls only once the handler has run): the call gives up with
    ClosedError and the communicator ends closed."""
    x = np.ones(8, np.float32)
    if comm.rank != 0:
        _wait_for_file(flag)
        return _outcome(lambda: comm.allreduce(x))[0]

    def handler(*_):
        if comm._engine.in_call:
            comm.close()
            open(flag, "w").close()
        else:                       # not inside yet: try again a little later
            signal.setitimer(signal.ITIMER_REAL, 0.05)
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    outcome = _outcome(lambda: comm.allreduce(x))
    return outcome[0], outcome[2] or "", comm.closed


def allreduce_with_memory_limit(comm, count):
    """A float16 rhd allreduce needs a float32 accumulator of 4 * count bytes: with
    the address space capped below that, the engine must report an allocation
    failure, not 'invalid arguments'.  out is made before the cap: a result array
    made under it would fit only where the heap happened to hold a free region
    of its size (numpy's MemoryError otherwise, before the engine runs)."""
    import resource
    x = np.ones(count, np.float16)
    out = np.empty_like(x)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + 2 * count, hard))
    try:
        return _outcome(lambda: comm.allreduce(x, out=out, algo="rhd"))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def late_allreduce(comm, late, seconds, flags=()):
    """Rank `late` waits `seconds`, and for the files `flags`, before its allreduce;
    every other rank creates its flag (flags[rank]) once its own allreduce ended."""
    x = np.ones(4, np.float32)
    if comm.rank == late:
        time.sleep(seconds)
        for flag in flags:
            _wait_for_file(flag, limit_s=120)
        return _outcome(lambda: comm.allreduce(x))
    outcome = _outcome(lambda: comm.allreduce(x))
    if flags:
        open(flags[comm.rank], "w").close()
    return outcome


def thread_pools(comm):
    """This rank's OMP_NUM_THREADS and the thread count of numpy's OpenBLAS, read from
    the library itself (as threadpoolctl does)."""
    import ctypes
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    blas = None
    for path in libs:
        lib = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                       "openblas_get_num_threads"):
            if hasattr(lib, symbol):
                blas = getattr(lib, symbol)()
    return os.environ.get("OMP_NUM_THREADS"), blas


def _symmetric_copy(comm, a):
    """a copied into a new symmetric allocation (collective)."""
    s = comm.empty(a.shape, a.dtype)
    s[...] = a
    return s


def run_case_symmetric(comm, symmetric_out, collective, shape, dtype_name, op, inplace,
                       algo=None, seed=0, root=0):
    """run_case with x in a symmetric allocation (the single-copy path), and out in one
    too when `symmetric_out` (out of place)."""
    P = comm.world_size
    x, out = _case_inputs(comm, collective, shape, dtype_name, op, seed, root)
    x = _symmetric_copy(comm, x)
    shape = tuple(shape)
    if inplace and collective in ("allgather", "gather"):
        out = comm.empty((P,) + shape, x.dtype)
    elif symmetric_out and not inplace and collective != "broadcast":
        result = {"allreduce": shape, "reduce": shape, "allgather": (P,) + shape,
                  "gather": (P,) + shape,
                  "reduce_scatter": (shape[0] // P,) + shape[1:] if shape else ()}[collective]
        out = comm.empty(result, x.dtype)
    if inplace:
        x, out = in_place(comm, collective, x, out, root)
    got = invoke(comm, collective, x, out, op, root, algo)
    return None if got is None else got.copy()


def run_cases_symmetric(comm, cases, symmetric_outs):
    return [run_case_symmetric(comm, so, *case) for case, so in zip(cases, symmetric_outs)]


def fanned_out_calls(comm, counts, calls):
    """Direct AllReduce, AllGather and Broadcast (the root moving round the ranks),
    `calls` times per count, each call's x new
    (rank, call and position in it), a rank late now and then: the number of wrong
    results against numpy, and the variants that ran.  With two small slots a fanned
    chunk's slot is reused every other chunk, so a writer that did not wait for the
    slowest reader would show here."""
    P, wrong, ran = comm.world_size, 0, set()
    for count in counts:
        ran.add(comm.algorithm_for("allreduce", count * 8, "direct"))
        base = np.arange(count, dtype=np.float64)
        for call in range(calls):
            if (call + comm.rank) % 7 == 0:
                time.sleep(0.002)
            x = base * (comm.rank + 1) + call
            want = base * (P * (P + 1) / 2) + P * call
            wrong += int(np.count_nonzero(comm.allreduce(x, algo="direct") != want))
            got = comm.allgather(x, algo="direct")
            wrong += sum(int(np.count_nonzero(got[q] != base * (q + 1) + call)) for q in range(P))
            root = call % P
            sent = x.copy()
            comm.broadcast(sent, root=root, algo="direct")
            wrong += int(np.count_nonzero(sent != base * (root + 1) + call))
    return wrong, ran
