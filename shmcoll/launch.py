"""launch(): run a function on N ranks (spawned processes) and collect the results.

The launcher creates the job's segment, starts the ranks, and watches their result
pipes: a rank ends with one message, or with end-of-file when it died.  The first
failure (an exception or a death) aborts the job naming that rank, so the others stop
waiting at once; after a short grace period every rank still running is killed, the
name is unlinked, and a LaunchError names each failed rank with its traceback or signal.
"""
import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, List, Optional, Sequence

from shmcoll._core import segment
from shmcoll._core.settings import EngineParams, get
from shmcoll.errors import JobAbortedError, LaunchError, PeerLostError
from shmcoll.tuning import selector

_GRACE_S = 2.0
# The thread pools of numpy's BLAS and of OpenMP code: each starts one thread per CPU
# unless told otherwise, so N ranks would run N x CPUs threads on CPUs cores.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_said_threads = False


def launch(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (),
           timeout: Optional[float] = None, bind: Optional[str] = None,
           threads: Optional[int] = None) -> List[Any]:
    """Start `nprocs` ranks, call ``fn(comm, *args)`` in each; return results in rank order.

    `fn` and `args` must be picklable (the spawn start method is used).  `timeout`
    bounds every wait inside a collective (default SHMCOLL_TIMEOUT).  `bind` pins the
    ranks: "core" (one CPU each), "llc" (the CPUs of a last-level-cache group) or "numa"
    (a NUMA node), in topology order so that rank neighbours share caches
    (shmcoll._core.topology); None leaves placement to the scheduler.  `threads` is each
    rank's OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS; by default they
    are max(1, usable CPUs // nprocs) unless the caller's environment sets any of them.
    """
    nprocs = int(nprocs)
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    _check_sendable(fn, args)
    places = [None] * nprocs
    if bind is not None:
        from shmcoll._core import topology
        places = topology.placement(topology.discover(), nprocs, bind)
    params = EngineParams.from_env(nprocs, timeout)
    selector.parse_overrides(get("SHMCOLL_ALGO"))     # a bad value fails here, not in N ranks
    thread_env = thread_environment(nprocs, threads)
    name, token = segment.launch_identity()
    seg = segment.create(name, nprocs, params, token)
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    try:
        with _environment(thread_env):
            _start(ctx, procs, conns, fn, args, nprocs, name, token, params, places)
        return _collect(procs, conns, seg)
    finally:
        _stop(procs)
        segment.unlink(name)
        for c in conns:
            c.close()


def _check_sendable(fn, args):
    """Ranks are new Python processes (spawn): they import `fn` by its module and name.
    A function they could not import is refused here, before any rank starts, instead
    of every rank dying with the reason only on its stderr."""
    name = getattr(fn, "__qualname__", repr(fn))
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise ValueError(
            f"launch({name}): {name} is defined in an interactive session (a REPL, a "
            f"notebook or python -c), which the ranks, new processes that import it by "
            f"name, cannot import; define it in a module or a script file and import it")
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same here
        raise TypeError(f"launch({name}): the function must be picklable by reference (a "
                        f"module-level function, not a lambda or a nested function): "
                        f"{e}") from None


def thread_environment(nprocs, threads=None):
    """{variable: value} of the thread pools each of `nprocs` ranks gets: `threads`
    when given, else max(1, usable CPUs // nprocs) unless the caller set any of
    THREAD_VARIABLES (then none is touched).  Says once what it chose."""
    global _said_threads
    if threads is None:
        if any(os.environ.get(v) for v in THREAD_VARIABLES):
            return {}
        from shmcoll._core.topology import usable_cpus
        cpus = usable_cpus()
        threads = max(1, cpus // nprocs)
        if not _said_threads and threads < cpus:
            _said_threads = True
            print(f"shmcoll: each of the {nprocs} ranks runs {threads} BLAS/OpenMP thread(s) "
                  f"({cpus} usable CPUs); set OMP_NUM_THREADS or pass threads= to choose",
                  file=sys.stderr)
    if isinstance(threads, bool) or int(threads) != threads or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    return {v: str(int(threads)) for v in THREAD_VARIABLES}


@contextlib.contextmanager
def _environment(values):
    """os.environ with `values` while the ranks start (they inherit it), then restored."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _start(ctx, procs, conns, fn, args, nprocs, name, token, params, places):
    """Start the ranks, each with a pipe for its one result message."""
    for rank in range(nprocs):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank_main, name=f"shmcoll-rank-{rank}",
                           args=(fn, args, rank, nprocs, name, token, params, writer,
                                 places[rank], os.getpid()))
        proc.start()
        writer.close()
        procs.append(proc)
        conns.append(reader)


def _collect(procs, conns, seg):
    """Each rank ends with one message on its pipe, or with EOF when it died."""
    outcomes = {}
    pending = {conn: rank for rank, conn in enumerate(conns)}
    deadline = None
    while pending:
        ready = wait(list(pending), timeout=_remaining(deadline))
        if not ready:
            break           # grace period over: the rest are killed by _stop
        for conn in ready:
            rank = pending.pop(conn)
            outcomes[rank] = _receive(conn, procs[rank])
        failed = [r for r, (status, _) in outcomes.items() if status != "ok"]
        if deadline is None and failed:
            seg.abort(failed[0])    # survivors stop waiting at once, naming the rank
            deadline = _now() + _GRACE_S
    if len(outcomes) == len(procs) and all(status == "ok" for status, _ in outcomes.values()):
        return [outcomes[r][1] for r in range(len(procs))]
    # Name the ranks that failed first; ranks that only saw a peer fail are
    # consequences and are named only when no first cause is known.
    failures = {r: text for r, (status, text) in outcomes.items() if status == "error"}
    if not failures:
        failures = {r: text for r, (status, text) in outcomes.items() if status == "secondary"}
    for rank in range(len(procs)):
        if rank not in outcomes:
            failures[rank] = "did not finish: killed after another rank failed"
    raise LaunchError(_format(failures), failures)


def _receive(conn, proc):
    try:
        return conn.recv()
    except (EOFError, OSError):
        proc.join(5.0)
        return "error", _describe_exit(proc.exitcode)


def _describe_exit(code):
    if code is None:
        return "exited without reporting a result"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code} without reporting a result"


def _format(failures):
    lines = [f"{len(failures)} rank(s) failed: {', '.join(map(str, sorted(failures)))}"]
    for rank in sorted(failures):
        lines.append(f"--- rank {rank}: {failures[rank].rstrip()}")
    return "\n".join(lines)


def _now():
    import time
    return time.monotonic()


def _remaining(deadline):
    return None if deadline is None else max(0.0, deadline - _now())


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()


def _die_with_parent(launcher_pid, name):
    """Ask the kernel to SIGKILL this rank if the launcher dies (Linux).  A launcher
    that died before the request was made is seen as a parent other than the launcher
    (init, or a subreaper such as systemd --user, tini or a container's init): the
    job is over, and the name it left behind is removed on the way out."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != launcher_pid:
        segment.unlink(name)
        os._exit(1)


def _rank_main(fn, args, rank, world, name, token, params, conn, cpus=None, launcher_pid=None):
    from shmcoll.communicator import attach
    _die_with_parent(os.getppid() if launcher_pid is None else launcher_pid, name)
    if cpus is not None:
        from shmcoll._core.topology import bind_self
        bind_self(cpus)
    try:
        comm = attach(name, rank, world, token, params)
        with comm:
            result = fn(comm, *args)
        conn.send(("ok", result))
    except (JobAbortedError, PeerLostError):
        conn.send(("secondary", traceback.format_exc()))
        sys.exit(1)
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            sys.exit(1)
