"""One driver for calling a collective by name, for perf, calibration, benchmarks and
tests alike: every collective's argument list is spelled here once."""
import functools


class _Nonblocking:
    """A communicator whose collectives are called with async_op=True."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return functools.partial(getattr(self._comm, name), async_op=True)


def bind(comm, collective, x, out=None, op="sum", root=0, algo=None, async_op=False):
    """comm.<collective> on these arguments as a closure of none: the dispatch happens
    here, once, so a timed loop pays a single Python call per collective, as a user's
    own loop would.  `op` goes to reductions, `root` to rooted collectives; async_op
    makes it return a Work."""
    c = _Nonblocking(comm) if async_op else comm    # blocking calls: no extra argument
    if collective == "allreduce":
        return lambda: c.allreduce(x, out, op, algo)
    if collective == "reduce":
        return lambda: c.reduce(x, out, op, root, algo)
    if collective == "reduce_scatter":
        return lambda: c.reduce_scatter(x, out, op, algo)
    if collective == "allgather":
        return lambda: c.allgather(x, out, algo)
    if collective == "gather":
        return lambda: c.gather(x, out, root, algo)
    if collective == "scatter":
        return lambda: c.scatter(x, out, root, algo)
    if collective == "broadcast":
        return lambda: c.broadcast(x, root, algo)
    if collective == "alltoall":
        return lambda: c.alltoall(x, out, algo)
    if collective == "sendrecv":    # nccl-tests' ring shift: to r+1, from r-1
        P, r = comm.world_size, comm.rank
        return lambda: c.sendrecv(x, (r + 1) % P, out, (r - 1) % P)
    if collective == "barrier":
        return c.barrier
    raise ValueError(f"unknown collective {collective!r}")


def invoke(comm, collective, x, out=None, op="sum", root=0, algo=None, async_op=False):
    """Call comm.<collective> now (see bind)."""
    return bind(comm, collective, x, out, op, root, algo, async_op)()


def in_place(comm, collective, x, out, root=0):
    """(x, out) for the in-place form of a call on x: out is x (allreduce, reduce),
    this rank's block of x (reduce_scatter), the root's own row of x (scatter), or x
    is this rank's row of out, written there first (allgather, gather).  Broadcast is
    in place anyway; alltoall and sendrecv have no in-place form (x, out as given)."""
    r = comm.rank
    if collective in ("allreduce", "reduce"):
        return x, x
    if collective == "reduce_scatter":
        m = x.shape[0] // comm.world_size
        return x, x[r * m:(r + 1) * m]
    if collective == "scatter":
        return x, (x[r, ...] if r == root else out)     # [r, ...]: 0-d rows stay arrays
    if collective in ("allgather", "gather"):
        out[r] = x
        return out[r, ...], out
    return x, out
