"""The compositions shmcoll.mpi.Communicator runs (simulator.hierarchy prices them):
node phases on the node's shared-memory communicator, the others on MPI.

Each function takes the communicator `c` (its node communicator, its `cross` MPI
communicator of the ranks holding its local rank on every node, in node order, the
node leaders as `cross` of local rank 0, and `c.mpi` over all ranks) and the checked
arguments.  `hierarchical` needs nodes of equal size; `flat` is MPI alone over all
ranks.  MPI reduces float16 and bfloat16 in float32 (it has no such types) and bool
as uint8; avg is a sum over both levels divided once at the end (floor division on
integers, as shmcoll's avg).  Results are in global rank order whatever the nodes'
ranks are.
"""
import zlib

import numpy as np

from shmcoll.arrays import _bfloat16_or_none
from shmcoll.errors import MismatchError
from shmcoll.mpi.waiting import complete

_MPI_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX",
            "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


# the types MPI has no reduction for: reduced in float32
_NARROW = {t for t in (np.dtype(np.float16), _bfloat16_or_none()) if t is not None}


def as_bytes(a):
    """a's memory as uint8 (C-contiguous a), for MPI calls that only move bytes."""
    return a.reshape(-1).view(np.uint8)


def wide(a):
    """The array MPI reduces for `a`: float16/bfloat16 as float32 (a copy), bool as
    uint8 (a view), anything else `a` itself (MPI reduces it as it lies)."""
    if a.dtype in _NARROW:
        return a.astype(np.float32)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    return a


def finish(reduced, op, world, out):
    """The reduced wide array into `out` (which may be `reduced` itself), divided by
    the world size for avg (floor division on integers, as shmcoll's avg)."""
    if op == "avg":
        if reduced.dtype.kind in "fc":
            np.divide(reduced, world, out=reduced)
        else:
            np.floor_divide(reduced, world, out=reduced)
    if not _same(reduced, out):
        out[...] = reduced.astype(np.uint8).view(np.bool_) if out.dtype == np.bool_ \
            else reduced
    return out


def _same(a, b):
    """a and b are one buffer (views of it, perhaps of other types)."""
    return a is b or (np.may_share_memory(a, b) and a.nbytes == b.nbytes and
                      a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def wide_copy(a):
    """wide(a) in memory of its own (MPI may reduce into it)."""
    return wide(a) if a.dtype in _NARROW else wide(a).copy()


def reduce_into(c, comm, x, out, op):
    """Start MPI's Iallreduce of x into out on `comm` and complete it, with no copy
    where MPI reduces x's type (x may be out itself: an in-place call)."""
    if x.dtype in _NARROW:
        total = wide(x)
        _mpi(c, comm.Iallreduce(c.MPI.IN_PLACE, total, op=mpi_op(c, op)))
        return finish(total, op, c.world_size, out)
    recv = wide(out)
    if _same(x, out):
        _mpi(c, comm.Iallreduce(c.MPI.IN_PLACE, recv, op=mpi_op(c, op)))
    else:
        _mpi(c, comm.Iallreduce(wide(_apart(x, out)), recv, op=mpi_op(c, op)))
    return finish(recv, op, c.world_size, out)


def _mpi(c, request):
    """Completes an MPI phase without holding the core (mpi.waiting)."""
    complete(request, c.wait_params, "shmcoll.mpi", c.faults)


def mpi_op(c, op):
    return getattr(c.MPI, _MPI_OPS["sum" if op == "avg" else op])


def node_op(op):
    """The op node phases run: avg sums (divided once at the end)."""
    return "sum" if op == "avg" else op


def block_order(members):
    """Global ranks in local-major order: local rank i's node block holds the blocks of
    ranks members[0][i], members[1][i], ... (its cross partners, in node order); None
    where that is rank order already (nodes whose ranks interleave), so no reordering
    copy is needed."""
    order = [members[j][i] for i in range(len(members[0])) for j in range(len(members))]
    return None if order == sorted(order) else order


# -- allreduce -----------------------------------------------------------------------

def allreduce_hierarchical(c, x, out, op):
    """node ReduceScatter -> cross Allreduce of this rank's n/L shard -> node AllGather."""
    n, L = x.size, c.local_size
    m = -(-n // L)
    flat = x.reshape(-1)
    if m * L != n:
        flat = np.concatenate([flat, np.zeros(m * L - n, x.dtype)])
    shard = c.node.reduce_scatter(flat, op=node_op(op))
    reduce_into(c, c.cross, shard, shard, op)
    if m * L == n:                          # straight into out: no copy
        c.node.allgather(shard, out=out.reshape(L, m))
    else:
        out[...] = c.node.allgather(shard).reshape(-1)[:n].reshape(x.shape)
    return out


def allreduce_leader(c, x, out, op):
    """node Reduce -> leaders Allreduce -> node Broadcast."""
    part = c.node.reduce(x, out=out if c.leader else None, op=node_op(op), root=0)
    if c.leader:
        reduce_into(c, c.cross, part, out, op)
    return c.node.broadcast(out, root=0)


def allreduce_flat(c, x, out, op):
    return reduce_into(c, c.mpi, x, out, op)


# -- reduce_scatter --------------------------------------------------------------------

def reduce_scatter_hierarchical(c, x, out, op):
    """node ReduceScatter of the blocks in local-major order (local rank i keeps its
    cross partners' blocks) -> cross ReduceScatter: node j's rank i keeps its own."""
    if c.block_order is not None:           # one copy, into the node's block order
        x = x.reshape((c.world_size, -1) + x.shape[1:])[c.block_order]
    mine = wide(c.node.reduce_scatter(x, op=node_op(op)))
    got = _landing(out, mine.dtype, (mine.shape[0] // c.nodes,) + mine.shape[1:])
    _mpi(c, c.cross.Ireduce_scatter_block(mine, got, op=mpi_op(c, op)))
    return finish(got.reshape(out.shape), op, c.world_size, out)


def reduce_scatter_flat(c, x, out, op):
    total = wide(x)
    got = _landing(out, total.dtype, (total.shape[0] // c.world_size,) + total.shape[1:])
    _mpi(c, c.mpi.Ireduce_scatter_block(total, got, op=mpi_op(c, op)))
    return finish(got, op, c.world_size, out)


def _landing(out, dtype, shape):
    """Where MPI writes a reduced block: out itself where it holds that type, else a
    buffer of the wide type that finish() copies into out."""
    if out.dtype not in _NARROW:
        return wide(out).reshape(shape)
    return np.empty(shape, dtype)


# -- reduce ------------------------------------------------------------------------------

def reduce_leader(c, x, out, op, root):
    """node Reduce -> leaders Reduce -> (leader -> root inside its node)."""
    part = c.node.reduce(x, op=node_op(op), root=0)
    home, where = c.node_of[root], c.local_of[root]
    result = None
    if c.leader:
        total = wide(part)                  # the engine's array: MPI may reduce into it
        here = c.node_index == home
        _mpi(c, c.cross.Ireduce(c.MPI.IN_PLACE if here else total, total if here else None,
                                op=mpi_op(c, op), root=home))
        if here:
            result = finish(total, op, c.world_size, np.empty_like(x))
            if where != 0:
                c.node.send(result, where)
    if c.rank != root:
        return None
    if where != 0:
        result = c.node.recv(np.empty_like(x), 0)
    return _into(out, result)


def reduce_flat(c, x, out, op, root):
    mine = c.rank == root
    total = wide_copy(x) if mine else wide(x)
    _mpi(c, c.mpi.Ireduce(c.MPI.IN_PLACE if mine else total, total if mine else None,
                          op=mpi_op(c, op), root=root))
    if not mine:
        return None
    return finish(total, op, c.world_size, out if out is not None else np.empty_like(x))


def _into(out, result):
    if out is None:
        return result
    out[...] = result
    return out


# -- broadcast -----------------------------------------------------------------------------

def broadcast_leader(c, x, root):
    """(root -> its leader inside its node) -> leaders Bcast -> node Broadcast."""
    home, where = c.node_of[root], c.local_of[root]
    if c.node_index == home and where != 0:
        c.node.broadcast(x, root=where)      # the root's node, leader included
    if c.leader:
        _mpi(c, c.cross.Ibcast(as_bytes(x), root=home))
    if c.node_index != home or where == 0:
        c.node.broadcast(x, root=0)
    return x


def broadcast_flat(c, x, root):
    _mpi(c, c.mpi.Ibcast(as_bytes(x), root=root))
    return x


# -- allgather and gather ----------------------------------------------------------------------

def _check_across_nodes(c, x):
    """Leaders compare their nodes' blocks (the node engine checked inside each node)
    before the variable-size MPI step: a rank whose array differs raises MismatchError
    on every leader.  One small nonblocking exchange, waited like every MPI phase."""
    mine = np.array([x.nbytes, zlib.crc32(f"{x.shape}{x.dtype.str}".encode())], np.int64)
    every = np.empty((c.nodes, 2), np.int64)
    _mpi(c, c.cross.Iallgather(mine, every))
    if (every != mine).any():
        raise MismatchError(f"ranks' arrays differ between nodes (bytes, type hash per "
                            f"node: {every.tolist()})", "count")


def _counts(c, x):
    return [len(m) * x.nbytes for m in c.members]


def _in_rank_order(c, flat, x, out):
    """The leaders' received node blocks (node order) placed at their ranks' rows."""
    at = 0
    for members in c.members:
        size = len(members) * x.nbytes
        out[members] = flat[at:at + size].view(x.dtype).reshape((len(members),) + x.shape)
        at += size
    return out


def allgather_hierarchical(c, x, out):
    """cross Allgather (this rank's partners' x, node order) -> node AllGather of those
    -> rows placed at their ranks."""
    partners = np.empty((c.nodes,) + x.shape, x.dtype)
    _mpi(c, c.cross.Iallgather(as_bytes(x), as_bytes(partners)))
    every = c.node.allgather(partners)                  # (L, N, *s): [i, j] is members[j][i]
    out[np.asarray(c.members).T] = every
    return out


def allgather_leader(c, x, out):
    """node Gather -> leaders Allgatherv of node blocks -> node Broadcast."""
    block = c.node.gather(x, root=0)
    if c.leader:
        _check_across_nodes(c, x)
        counts = _counts(c, x)
        flat = np.empty(sum(counts), np.uint8)
        _mpi(c, c.cross.Iallgatherv(as_bytes(block), [flat, counts]))
        _in_rank_order(c, flat, x, out)
    return c.node.broadcast(out, root=0)


def _apart(x, out):
    """x, copied if it lies in out (an in-place call: MPI refuses aliased buffers)."""
    return x.copy() if out is not None and np.may_share_memory(x, out) else x


def allgather_flat(c, x, out):
    _mpi(c, c.mpi.Iallgather(as_bytes(_apart(x, out)), as_bytes(out)))
    return out


def gather_leader(c, x, out, root):
    """node Gather -> leaders Gatherv -> (leader -> root inside its node)."""
    home, where = c.node_of[root], c.local_of[root]
    block = c.node.gather(x, root=0)
    result = None
    if c.leader:
        _check_across_nodes(c, x)
        counts = _counts(c, x)
        flat = np.empty(sum(counts), np.uint8) if c.node_index == home else None
        spec = [flat, counts] if flat is not None else None
        _mpi(c, c.cross.Igatherv(as_bytes(block), spec, root=home))
        if flat is not None:
            result = _in_rank_order(c, flat, x, np.empty((c.world_size,) + x.shape, x.dtype))
            if where != 0:
                c.node.send(result, where)
    if c.rank != root:
        return None
    if where != 0:
        result = c.node.recv(np.empty((c.world_size,) + x.shape, x.dtype), 0)
    return _into(out, result)


def gather_flat(c, x, out, root):
    mine = c.rank == root
    result = (out if out is not None else np.empty((c.world_size,) + x.shape, x.dtype)) \
        if mine else None
    into = as_bytes(result) if mine else None
    _mpi(c, c.mpi.Igather(as_bytes(_apart(x, result)), into, root=root))
    return result


# -- scatter and alltoall --------------------------------------------------------------------------

def scatter_leader(c, x, out, root):
    """(root -> its leader) -> leaders Scatterv of node blocks -> node Scatter."""
    home, where = c.node_of[root], c.local_of[root]
    full = None
    if c.node_index == home and c.leader:
        full = x if where == 0 else c.node.recv(
            np.empty((c.world_size,) + out.shape, out.dtype), where)
    elif c.rank == root:
        c.node.send(x, 0)
    rows = None
    if c.leader:
        rows = np.empty((c.local_size,) + out.shape, out.dtype)
        counts = _counts(c, out)
        send = None
        if full is not None:
            send = np.concatenate([as_bytes(np.ascontiguousarray(full[m])) for m in c.members])
        spec = [send, counts] if send is not None else None
        _mpi(c, c.cross.Iscatterv(spec, as_bytes(rows), root=home))
    return c.node.scatter(rows, out=out, root=0)


def scatter_flat(c, x, out, root):
    mine = c.rank == root
    into = np.empty_like(out) if mine and np.may_share_memory(x, out) else out
    _mpi(c, c.mpi.Iscatter(as_bytes(x) if mine else None, as_bytes(into), root=root))
    if into is not out:
        out[...] = into
    return out


def alltoall_flat(c, x, out):
    _mpi(c, c.mpi.Ialltoall(as_bytes(x), as_bytes(out)))
    return out


# -- one node: the shared-memory engine alone (its ranks are the global ones) -----------------

def allreduce_node(c, x, out, op):
    return c.node.allreduce(x, out=out, op=op)


def reduce_scatter_node(c, x, out, op):
    return c.node.reduce_scatter(x, out=out, op=op)


def reduce_node(c, x, out, op, root):
    return c.node.reduce(x, out=out, op=op, root=root)


def broadcast_node(c, x, root):
    return c.node.broadcast(x, root=root)


def allgather_node(c, x, out):
    return c.node.allgather(x, out=out)


def gather_node(c, x, out, root):
    return c.node.gather(x, out=out, root=root)


def scatter_node(c, x, out, root):
    return c.node.scatter(x if c.rank == root else None, out=out, root=root)


def alltoall_node(c, x, out):
    return c.node.alltoall(x, out=out)


def _runs(**by_collective):
    """{collective: {composition: function}} from the functions named collective_composition."""
    found = globals()
    return {coll: {name: found[f"{coll}_{name}"] for name in names}
            for coll, names in by_collective.items()}


RUNS = _runs(allreduce=("node", "hierarchical", "leader", "flat"),
             reduce_scatter=("node", "hierarchical", "flat"),
             reduce=("node", "leader", "flat"),
             broadcast=("node", "leader", "flat"),
             allgather=("node", "hierarchical", "leader", "flat"),
             gather=("node", "leader", "flat"),
             scatter=("node", "leader", "flat"),
             alltoall=("node", "flat"))
