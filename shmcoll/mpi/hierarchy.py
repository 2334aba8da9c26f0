"""The hierarchical communicator: a shmcoll Communicator inside each node, MPI across.

Ranks are grouped by node (MPI_Comm_split_type SHARED, or SHMCOLL_NODE's names);
each node's ranks form a shared-memory job whose name its first rank sends through
MPI (no other rendezvous).  Two MPI communicators cross the nodes: `cross`, the ranks
holding this local rank on every node (node order), and its local-rank-0 instance,
the node leaders.  With N nodes of L ranks and n bytes:

  allreduce   equal nodes: node ReduceScatter -> cross Allreduce of each n/L shard
              (every local rank uses the network at once, one crossing per shard)
              -> node AllGather; nodes of different sizes: node Reduce to the leader
              -> leaders Allreduce -> node Broadcast
  reduce      node Reduce -> leaders Reduce -> (leader -> root inside its node)
  broadcast   (root -> its leader inside its node) -> leaders Bcast -> node Broadcast
  allgather   node AllGather -> leaders Allgatherv of node blocks -> node Broadcast
  gather      node AllGather -> leaders Gatherv -> (leader -> root)
  scatter     (root -> its leader) -> leaders Scatterv of node blocks -> node Scatter
  reduce_scatter  the allreduce, then this rank's block
  alltoall    MPI Alltoall over the whole communicator
  barrier     node barrier -> leaders Barrier -> node barrier

One node is pure shared memory; one rank per node is pure MPI with the node steps
empty.  The MPI step reduces float16 and bfloat16 shards in float32 (MPI has no such
types) and bool as uint8; avg is a sum over both levels divided once at the end (floor
division on integers, as shmcoll's avg).  Results are in global rank order whatever
the nodes' ranks are.
"""
import uuid
from typing import Any, Optional

import numpy as np

from shmcoll import communicator as shared
from shmcoll._core.settings import get
from shmcoll.ops import ReduceOp

_MPI_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX",
            "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


def _op_name(op):
    return ReduceOp.from_code(shared._op(op)).value


def _bytes(a):
    """a's memory as uint8 (C-contiguous a), for MPI calls that only move bytes."""
    return a.reshape(-1).view(np.uint8)


def _narrow_types():
    names = {np.dtype(np.float16)}
    try:
        import ml_dtypes
        names.add(np.dtype(ml_dtypes.bfloat16))
    except ImportError:
        pass
    return names


_NARROW = _narrow_types()


def _wide(a):
    """The array MPI reduces for `a`: float16/bfloat16 as float32, bool as uint8."""
    if a.dtype in _NARROW:
        return a.astype(np.float32)
    if a.dtype == np.bool_:
        return a.view(np.uint8).copy()
    return a.copy()


def _finish(wide, op, world, dtype):
    """The reduced `wide` as `dtype`, divided by the world size for avg."""
    if op == "avg":
        wide = wide / world if wide.dtype.kind in "fc" else np.floor_divide(wide, world)
    if dtype == np.bool_:
        return wide.astype(np.uint8).view(np.bool_)
    return wide.astype(dtype)


class Communicator:
    """A communicator over `mpi_comm` (default MPI.COMM_WORLD): shared memory inside each
    node, MPI between nodes.  Every rank of mpi_comm must construct it.  The collectives
    take numpy arrays and mean what shmcoll.Communicator's mean (blocking calls)."""

    def __init__(self, mpi_comm: Any = None, timeout: Optional[float] = None) -> None:
        from mpi4py import MPI
        self._MPI = MPI
        self.mpi = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank, self.world_size = self.mpi.Get_rank(), self.mpi.Get_size()
        local = self._local_comm()
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        lowest = local.allreduce(self.rank, op=MPI.MIN)
        table = self.mpi.allgather((lowest, self.local_rank))
        firsts = sorted({t[0] for t in table})          # nodes, by their lowest rank
        self.node_of = [firsts.index(t[0]) for t in table]
        self.local_of = [t[1] for t in table]
        self.nodes, self.node_index = len(firsts), firsts.index(lowest)
        self.members = [[r for r in range(self.world_size) if self.node_of[r] == j]
                        for j in range(self.nodes)]
        self.equal = len({len(m) for m in self.members}) == 1
        self.cross = self.mpi.Split(self.local_rank, key=self.node_index)
        job = local.bcast(f"mpi-{uuid.uuid4().hex}" if self.local_rank == 0 else None, root=0)
        local.Free()
        self.node = shared.join(self.local_rank, self.local_size, job, job, timeout)

    def _local_comm(self):
        """The ranks of this node: SHMCOLL_NODE's name, else MPI's shared-memory split."""
        name = get("SHMCOLL_NODE")
        if name is None:
            return self.mpi.Split_type(self._MPI.COMM_TYPE_SHARED, key=self.rank)
        names = self.mpi.allgather(name)
        first = {}
        for r, n in enumerate(names):
            first.setdefault(n, r)
        return self.mpi.Split(sorted(first.values()).index(first[name]), key=self.rank)

    @property
    def leader(self) -> bool:
        return self.local_rank == 0

    def _mpi_op(self, op):
        return getattr(self._MPI, _MPI_OPS[op])

    def _check_root(self, root):
        return shared._root(root, self.world_size)

    # -- reductions ----------------------------------------------------------------
    def allreduce(self, x, out=None, op="sum"):
        """Reduce x over all ranks; every rank gets the result (x's shape and dtype)."""
        x, name = np.ascontiguousarray(x), _op_name(op)
        out = np.empty_like(x) if out is None else out
        if self.nodes == 1:
            return self.node.allreduce(x, out=out, op=name)
        local = "sum" if name == "avg" else name
        if self.equal and self.local_size > 1:
            L, n = self.local_size, x.size
            m = -(-n // L)
            flat = x.reshape(-1)
            if m * L != n:
                flat = np.concatenate([flat, np.zeros(m * L - n, x.dtype)])
            wide = _wide(self.node.reduce_scatter(flat, op=local))
            self.cross.Allreduce(self._MPI.IN_PLACE, wide, op=self._mpi_op(local))
            shard = _finish(wide, name, self.world_size, x.dtype)
            out[...] = self.node.allgather(shard).reshape(-1)[:n].reshape(x.shape)
            return out
        part = self.node.reduce(x, op=local, root=0)
        if self.leader:
            wide = _wide(part)
            self.cross.Allreduce(self._MPI.IN_PLACE, wide, op=self._mpi_op(local))
            out[...] = _finish(wide, name, self.world_size, x.dtype)
        return self.node.broadcast(out, root=0)

    def reduce(self, x, out=None, op="sum", root=0):
        """Reduce x over all ranks into `root`: the result there, None elsewhere."""
        root, x, name = self._check_root(root), np.ascontiguousarray(x), _op_name(op)
        local = "sum" if name == "avg" else name
        part = self.node.reduce(x, op=local, root=0)
        home, where = self.node_of[root], self.local_of[root]
        result = None
        if self.leader:
            wide = _wide(part)
            if self.nodes > 1:
                here = self.node_index == home
                self.cross.Reduce(self._MPI.IN_PLACE if here else wide, wide if here else None,
                                  op=self._mpi_op(local), root=home)
            if self.node_index == home:
                result = _finish(wide, name, self.world_size, x.dtype)
                if where != 0:
                    self.node.send(result, where)
        if self.node_index == home and self.rank == root:
            if where != 0:
                result = self.node.recv(np.empty_like(x), 0)
            if out is not None:
                out[...] = result
                result = out
        return result if self.rank == root else None

    def reduce_scatter(self, x, out=None, op="sum"):
        """Rank r gets rows [r*m, (r+1)*m) of the reduction, m = x.shape[0] // world_size."""
        x = np.ascontiguousarray(x)
        if x.ndim == 0 or x.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by world_size "
                             f"{self.world_size}; got shape {x.shape}")
        m = x.shape[0] // self.world_size
        mine = self.allreduce(x, op=op)[self.rank * m:(self.rank + 1) * m]
        if out is None:
            return mine.copy()
        out[...] = mine
        return out

    # -- copies ---------------------------------------------------------------------
    def broadcast(self, x, root=0):
        """The root's x into x on every rank (in place); returns x."""
        root = self._check_root(root)
        home, where = self.node_of[root], self.local_of[root]
        if self.node_index == home and where != 0:
            self.node.broadcast(x, root=where)      # the root's node, leader included
        if self.nodes > 1 and self.leader:
            self.cross.Bcast(_bytes(x), root=home)
        if self.node_index != home or where == 0:
            self.node.broadcast(x, root=0)
        return x

    def _node_stacks(self, x):
        """The leaders' view of every node's allgathered block, in global rank order:
        (P, *x.shape) on leaders, None elsewhere; the block sizes are checked first."""
        block = self.node.allgather(x)
        if not self.leader:
            return None
        shapes = self.cross.allgather((x.shape, x.dtype.str))
        if any(s != shapes[0] for s in shapes):
            from shmcoll.errors import MismatchError
            raise MismatchError(f"ranks' arrays differ between nodes: {shapes}", "count")
        return block

    def _in_rank_order(self, node_blocks, x):
        out = np.empty((self.world_size,) + x.shape, x.dtype)
        for j, members in enumerate(self.members):
            out[members] = node_blocks[j]
        return out

    def _split_nodes(self, flat, x):
        """Leaders' received bytes, cut into node blocks (len(members) rows each)."""
        row, at, blocks = x.nbytes, 0, []
        for members in self.members:
            size = len(members) * row
            blocks.append(flat[at:at + size].view(x.dtype).reshape((len(members),) + x.shape))
            at += size
        return blocks

    def _counts(self, x):
        return [len(m) * x.nbytes for m in self.members]

    def allgather(self, x, out=None):
        """Every rank gets the stack of all ranks' x: shape (world_size, *x.shape)."""
        x = np.ascontiguousarray(x)
        shape = (self.world_size,) + x.shape
        out = np.empty(shape, x.dtype) if out is None else out
        if self.nodes == 1:
            return self.node.allgather(x, out=out)
        block = self._node_stacks(x)
        if self.leader:
            counts = self._counts(x)
            flat = np.empty(sum(counts), np.uint8)
            self.cross.Allgatherv(_bytes(block), [flat, counts])
            out[...] = self._in_rank_order(self._split_nodes(flat, x), x)
        return self.node.broadcast(out, root=0)

    def gather(self, x, out=None, root=0):
        """`root` gets the stack of all ranks' x; other ranks get None."""
        root, x = self._check_root(root), np.ascontiguousarray(x)
        home, where = self.node_of[root], self.local_of[root]
        block = self._node_stacks(x) if self.nodes > 1 else self.node.allgather(x)
        result = None
        if self.leader:
            if self.nodes > 1:
                counts = self._counts(x)
                flat = np.empty(sum(counts), np.uint8) if self.node_index == home else None
                self.cross.Gatherv(_bytes(block), [flat, counts] if flat is not None else None,
                                   root=home)
                if flat is not None:
                    result = self._in_rank_order(self._split_nodes(flat, x), x)
            else:
                result = block
            if self.node_index == home and where != 0:
                self.node.send(result, where)
        if self.rank != root:
            return None
        if where != 0:
            result = self.node.recv(np.empty((self.world_size,) + x.shape, x.dtype), 0)
        if out is not None:
            out[...] = result
            return out
        return result

    def scatter(self, x, out=None, root=0):
        """Row r of the root's x, shape (world_size, *s), goes to rank r; other ranks
        pass out (their buffer of shape s) or any x of the root's shape and dtype."""
        root = self._check_root(root)
        home, where = self.node_of[root], self.local_of[root]
        like = np.asarray(x) if x is not None else None
        if self.rank == root:
            like = np.ascontiguousarray(like)
            if like.ndim == 0 or like.shape[0] != self.world_size:
                raise ValueError(f"scatter needs x.shape[0] == world_size {self.world_size}; "
                                 f"got shape {like.shape}")
        row_shape = out.shape if out is not None else like.shape[1:]
        dtype = out.dtype if out is not None else like.dtype
        full = None
        if self.node_index == home and self.leader:
            full = like if where == 0 else self.node.recv(
                np.empty((self.world_size,) + tuple(row_shape), dtype), where)
        elif self.rank == root:
            self.node.send(like, 0)
        rows = None
        if self.leader:
            mine = np.empty((self.local_size,) + tuple(row_shape), dtype)
            if self.nodes > 1:
                one = np.empty(row_shape, dtype)
                counts = self._counts(one)
                send = None
                if full is not None:
                    send = np.concatenate([_bytes(np.ascontiguousarray(full[m]))
                                           for m in self.members])
                self.cross.Scatterv([send, counts] if send is not None else None, _bytes(mine),
                                    root=home)
            else:
                mine[...] = full[self.members[0]]
            rows = mine
        got = self.node.scatter(rows, out=np.empty(row_shape, dtype) if out is None else out,
                                root=0)
        return got

    def alltoall(self, x, out=None):
        """x has shape (world_size, *s); rank r gets row r of every rank's x."""
        x = np.ascontiguousarray(x)
        if x.ndim == 0 or x.shape[0] != self.world_size:
            raise ValueError(f"alltoall needs x.shape[0] == world_size {self.world_size}; "
                             f"got shape {x.shape}")
        out = np.empty_like(x) if out is None else out
        self.mpi.Alltoall(_bytes(x), _bytes(out))
        return out

    def barrier(self):
        self.node.barrier()
        if self.nodes > 1 and self.leader:
            self.cross.Barrier()
        self.node.barrier()

    # -- lifecycle -------------------------------------------------------------------
    def close(self):
        """Leave the node's shared-memory job and free the MPI communicators made here
        (mpi_comm itself stays the caller's)."""
        if not self.node.closed:
            self.node.close()
            self.cross.Free()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.node._fail()
        return False

    def __repr__(self):
        return (f"<shmcoll.mpi.Communicator rank {self.rank} of {self.world_size}: "
                f"{self.nodes} node(s), local rank {self.local_rank} of {self.local_size}>")
