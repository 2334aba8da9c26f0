"""The hierarchical communicator: a shmcoll Communicator inside each node, MPI across.

Ranks are grouped by node (MPI_Comm_split_type SHARED, or SHMCOLL_NODE's names);
each node's ranks form a shared-memory job whose name its first rank sends through
MPI (no other rendezvous).  Two MPI communicators cross the nodes: `cross`, the ranks
holding this local rank on every node (node order), and its local-rank-0 instance,
the node leaders.  Each call runs one of the compositions of simulator.hierarchy
(hierarchical, leader or flat MPI), the cheapest on a model of this cluster (the
node engine's calibration inside a node, a measured or given link between nodes)
unless `algo=` names one; `algorithm_for` and SHMCOLL_DEBUG=INFO say which and why.

One node is pure shared memory; one rank per node is pure MPI.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from shmcoll import communicator as shared
from shmcoll._core.settings import EngineParams, get
from shmcoll.errors import ClosedError, PeerLostError
from shmcoll.mpi import model, schedules
from shmcoll.mpi.faults import FaultNotices
from shmcoll.mpi.waiting import complete
from shmcoll.mpi.work import Calls
from shmcoll.ops import ReduceOp
from shmcoll.simulator import hierarchy

log = logging.getLogger("shmcoll")


def _op_name(op):
    return ReduceOp.from_code(shared._op(op)).value


def _out(out, shape, dtype, what):
    """out, checked: a writeable C-contiguous numpy array of the result's shape and
    dtype (shape None: any), written in place, never through a copy."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a numpy array, got {type(out).__name__}")
    if (shape is not None and out.shape != tuple(shape)) or out.dtype != dtype:
        raise ValueError(f"{what}: out has shape {out.shape} and dtype {out.dtype}; the "
                         f"result has shape {tuple(shape or out.shape)} and dtype {dtype}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{what}: out must be writeable and C-contiguous")
    return out


def _in_global_ranks(error, members, node):
    """A PeerLostError of the node's engine names node-local ranks: say which ranks of
    this communicator they are (error.rank becomes the global one)."""
    if error.rank is not None and 0 <= error.rank < len(members):
        error.args = (f"{error} [node {node}'s ranks numbered locally: local rank "
                      f"{error.rank} is rank {members[error.rank]}]",) + error.args[1:]
        error.rank = members[error.rank]


def _rows_of(x, world, what):
    if x.ndim == 0 or x.shape[0] != world:
        raise ValueError(f"{what} needs x.shape[0] == world_size {world}; got shape {x.shape}")


class Communicator:
    """A communicator over `mpi_comm` (default MPI.COMM_WORLD): shared memory inside each
    node, MPI between nodes.  Every rank of mpi_comm must construct it.  The collectives
    take numpy arrays and mean what shmcoll.Communicator's mean, with ``async_op`` (a
    shmcoll.Work; calls complete in issue order) and ``algo`` ('hierarchical',
    'leader', 'flat' or 'auto').  `inter_link` ('25GB/s:2us', a preset name or a
    simulator Link) skips measuring the link between nodes."""

    def __init__(self, mpi_comm: Any = None, timeout: Optional[float] = None,
                 inter_link: Any = None) -> None:
        from mpi4py import MPI
        self.MPI = MPI
        self.mpi = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self._owns_mpi = False
        self.rank, self.world_size = self.mpi.Get_rank(), self.mpi.Get_size()
        self._timeout = timeout
        local, machine_ranks = self._local_comm()
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
        self.block_order = schedules.block_order(self.members) if self.equal else None
        self.cross = self.mpi.Split(self.local_rank, key=self.node_index)
        job = local.bcast(f"mpi-{uuid.uuid4().hex}" if self.local_rank == 0 else None, root=0)
        local.Free()
        self.node = shared.join(self.local_rank, self.local_size, job, job, timeout,
                                machine_ranks=machine_ranks)
        self.wait_params = EngineParams.from_env(machine_ranks, timeout)
        self.faults = FaultNotices(self.mpi)
        self._calls = Calls(f"{self.rank}", MPI, self._usable, self._failed)
        self._pools: Dict[str, list] = {}
        self._choices: Dict[Tuple[str, int, Optional[str]], hierarchy.Choice] = {}
        self._debug = str(get("SHMCOLL_DEBUG")).upper() in ("INFO", "TRACE")
        self.cluster = None
        if self.nodes > 1 and max(len(m) for m in self.members) > 1:
            link = model.inter_link(self.mpi, (self.members[0][0], self.members[1][0]),
                                    inter_link)
            self.cluster = model.cluster(self.mpi, self.nodes,
                                         max(len(m) for m in self.members),
                                         self.node._engine.decider.model, link)

    def _local_comm(self):
        """(The ranks of this node, how many ranks share this machine's cores): the node
        is SHMCOLL_NODE's name, else MPI's shared-memory split, which is the machine."""
        machine = self.mpi.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        name = get("SHMCOLL_NODE")
        if name is None:
            return machine, machine.Get_size()
        machine_ranks = machine.Get_size()
        machine.Free()
        names = self.mpi.allgather(name)
        first: Dict[str, int] = {}
        for r, n in enumerate(names):
            first.setdefault(n, r)
        return (self.mpi.Split(sorted(first.values()).index(first[name]), key=self.rank),
                machine_ranks)

    @property
    def leader(self) -> bool:
        return self.local_rank == 0

    # -- what runs ----------------------------------------------------------------
    def _pool(self, collective):
        """The priced compositions of `collective` this communicator can run."""
        pool = self._pools.get(collective)
        if pool is None:
            names = [n for n in schedules.RUNS[collective] if n != "node" and
                     (n != "hierarchical" or (self.equal and self.local_size > 1))]
            pool = self._pools[collective] = hierarchy.candidates(
                collective, self.cluster, self._placement(), names)
        return pool

    def _placement(self):
        """Each rank's device in the modelled cluster (node j's i-th rank: j*L + i)."""
        return [self.node_of[r] * self.cluster.per_node + self.local_of[r]
                for r in range(self.world_size)]

    def choice(self, collective: str, nbytes: int, algo: Optional[str] = None) -> hierarchy.Choice:
        """The composition a call of `collective` on nbytes (priced as in
        shmcoll.collectives) runs, with its reason and every candidate's modelled time."""
        key = (collective, nbytes, algo)
        found = self._choices.get(key)
        if found is None:
            if algo is not None and not isinstance(algo, str):
                raise ValueError(f"algo must be a composition name, 'auto' or None, got {algo!r}")
            if self.cluster is None:
                only = "flat" if self.nodes > 1 else "node"
                if algo not in (None, "auto", only):
                    raise ValueError(f"algo {algo!r}: with {self.nodes} node(s) of "
                                     f"{self.local_size} rank(s) only {only!r} runs")
                pure = hierarchy.Priced(collective, only, "-", self.world_size, 0, 0, 0, (), ())
                found = hierarchy.Choice(only, pure, "layout", ((only, 0.0),))
            else:
                found = hierarchy.choose(self._pool(collective), nbytes, algo)
            if len(self._choices) > 4096:
                self._choices.clear()
            self._choices[key] = found
            if self._debug:
                log.info("rank %d: %s", self.rank, found.describe(nbytes))
        return found

    def compositions(self, collective: str) -> List[str]:
        """The names `algo=` may take for `collective` here (besides 'auto')."""
        if self.cluster is None:
            return ["flat" if self.nodes > 1 else "node"]
        return list(dict.fromkeys(p.algorithm for p in self._pool(collective)))

    def algorithm_for(self, collective: str, nbytes: int, algo: Optional[str] = None,
                      device: bool = False) -> str:
        """'hierarchical', 'leader', 'flat', or 'node' (one node: shared memory alone);
        numpy arrays only (device must be False)."""
        if device:
            raise ValueError("shmcoll.mpi.Communicator takes numpy arrays only")
        return self.choice(collective, nbytes, algo).name

    def synchronize(self) -> None:
        """Nothing to wait for: numpy arrays only (shmcoll.Communicator's counterpart)."""

    def _composed(self, collective, nbytes, algo, async_op, *args):
        """The chosen composition of `collective` on args, now or queued (async_op)."""
        run = schedules.RUNS[collective][self.choice(collective, nbytes, algo).name]
        return self._calls.run(collective, lambda: run(self, *args), async_op)

    # -- reductions ----------------------------------------------------------------
    def allreduce(self, x, out=None, op="sum", algo=None, async_op=False):
        """Reduce x over all ranks; every rank gets the result (x's shape and dtype)."""
        x, name = np.ascontiguousarray(x), _op_name(op)
        out = np.empty_like(x) if out is None else _out(out, x.shape, x.dtype, "allreduce")
        return self._composed("allreduce", x.nbytes, algo, async_op, x, out, name)

    def reduce(self, x, out=None, op="sum", root=0, algo=None, async_op=False):
        """Reduce x over all ranks into `root`: the result there, None elsewhere."""
        root, x, name = shared._root(root, self.world_size), np.ascontiguousarray(x), _op_name(op)
        out = _out(out, x.shape, x.dtype, "reduce") if self.rank == root else None
        return self._composed("reduce", x.nbytes, algo, async_op, x, out, name, root)

    def reduce_scatter(self, x, out=None, op="sum", algo=None, async_op=False):
        """Rank r gets rows [r*m, (r+1)*m) of the reduction, m = x.shape[0] // world_size."""
        x, name = np.ascontiguousarray(x), _op_name(op)
        if x.ndim == 0 or x.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by world_size "
                             f"{self.world_size}; got shape {x.shape}")
        m = x.shape[0] // self.world_size
        shape = (m,) + x.shape[1:]
        out = np.empty(shape, x.dtype) if out is None else _out(out, shape, x.dtype,
                                                                 "reduce_scatter")
        return self._composed("reduce_scatter", x.nbytes, algo, async_op, x, out, name)

    # -- copies ---------------------------------------------------------------------
    def broadcast(self, x, root=0, algo=None, async_op=False):
        """The root's x into x on every rank (in place); returns x."""
        root = shared._root(root, self.world_size)
        _out(x, None, getattr(x, "dtype", None), "broadcast (x is written in place)")
        return self._composed("broadcast", x.nbytes, algo, async_op, x, root)

    def allgather(self, x, out=None, algo=None, async_op=False):
        """Every rank gets the stack of all ranks' x: shape (world_size, *x.shape)."""
        x = np.ascontiguousarray(x)
        shape = (self.world_size,) + x.shape
        out = np.empty(shape, x.dtype) if out is None else _out(out, shape, x.dtype, "allgather")
        return self._composed("allgather", out.nbytes, algo, async_op, x, out)

    def gather(self, x, out=None, root=0, algo=None, async_op=False):
        """`root` gets the stack of all ranks' x; other ranks get None."""
        root, x = shared._root(root, self.world_size), np.ascontiguousarray(x)
        if self.rank == root:
            out = _out(out, (self.world_size,) + x.shape, x.dtype, "gather")
        return self._composed("gather", x.nbytes * self.world_size, algo, async_op,
                              x, out, root)

    def scatter(self, x, out=None, root=0, algo=None, async_op=False):
        """Row r of the root's x, shape (world_size, *s), goes to rank r; other ranks
        pass out (their buffer of shape s) or any x of the root's shape and dtype."""
        root = shared._root(root, self.world_size)
        if self.rank == root:
            x = np.ascontiguousarray(x)
            _rows_of(x, self.world_size, "scatter")
        elif out is None:
            x = np.asarray(x)
        if out is None:
            out = np.empty(x.shape[1:], x.dtype)
        elif self.rank == root:
            _out(out, x.shape[1:], x.dtype, "scatter")
        else:
            _out(out, None, out.dtype if isinstance(out, np.ndarray) else None, "scatter")
        return self._composed("scatter", out.nbytes * self.world_size, algo, async_op,
                              x, out, root)

    def alltoall(self, x, out=None, algo=None, async_op=False):
        """x has shape (world_size, *s); rank r gets row r of every rank's x."""
        x = np.ascontiguousarray(x)
        _rows_of(x, self.world_size, "alltoall")
        out = np.empty_like(x) if out is None else _out(out, x.shape, x.dtype, "alltoall")
        return self._composed("alltoall", x.nbytes, algo, async_op, x, out)

    def barrier(self, async_op=False):
        """Return once every rank has entered the barrier."""
        def call():
            self.node.barrier()
            if self.nodes > 1 and self.leader:
                complete(self.cross.Ibarrier(), self.wait_params, "barrier", self.faults)
            self.node.barrier()
        return self._calls.run("barrier", call, async_op)

    # -- Python objects (pickled, as mpi4py's lower-case calls) ----------------------
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self._calls.run("broadcast_object", lambda: self.mpi.bcast(obj, root=root), False)

    def allgather_object(self, obj: Any) -> List[Any]:
        return self._calls.run("allgather_object", lambda: self.mpi.allgather(obj), False)

    def gather_object(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        return self._calls.run("gather_object", lambda: self.mpi.gather(obj, root=root), False)

    def scatter_object(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        return self._calls.run("scatter_object", lambda: self.mpi.scatter(objs, root=root),
                               False)

    # -- sub-communicators -------------------------------------------------------------
    def split(self, color: Optional[int], key: Optional[int] = None) -> Optional[Communicator]:
        """MPI's Comm_split: a hierarchical communicator of the ranks passing the same
        color, ordered by key then rank; None for color=None.  Every rank must call."""
        if color is not None:
            color = shared._nonnegative(color, "color")
        key = self.rank if key is None else shared._integer(key, "key")
        self._calls.drain()
        sub = self.mpi.Split(self.MPI.UNDEFINED if color is None else color, key)
        if color is None:
            return None
        child = Communicator(sub, self._timeout, self.cluster.inter if self.cluster else None)
        child._owns_mpi = True
        return child

    def _usable(self):
        """Raise unless this rank may start a call: open, and no other rank failed."""
        if self.node.closed:
            raise ClosedError("the communicator is closed")
        self.faults.check()

    def _failed(self, error):
        """A call of this rank failed: every other rank must learn of it (mpi.faults)."""
        if isinstance(error, PeerLostError) and error is not self.faults.received:
            _in_global_ranks(error, self.members[self.node_index], self.node_index)
        self.faults.tell(error)
        self.node._fail()

    # -- lifecycle -------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.node.closed

    def close(self):
        """Wait for the nonblocking calls, leave the node's shared-memory job and free the
        MPI communicators made here (mpi_comm itself stays the caller's).  After a
        failure the MPI communicators are left as they are: freeing one is collective,
        and the job's other ranks are not in step any more."""
        self._calls.drain()
        broken = self.node.closed or self._calls.failed
        if not self.node.closed:
            self.node.close()
        if self.cross is None or broken:
            self.cross = None
            return
        self.faults.close()
        self.cross.Free()
        self.cross = None
        if self._owns_mpi:
            self.mpi.Free()

    def abort(self, errorcode: int = 1) -> None:
        """End every process of the MPI job now (MPI_Abort): what a rank that caught an
        error its peers cannot learn of should do rather than leave them waiting."""
        self._failed(RuntimeError(f"MPI_Abort({errorcode})"))
        self.mpi.Abort(errorcode)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif not self.node.closed:
            self._failed(exc)
        return False

    def __repr__(self):
        return (f"<shmcoll.mpi.Communicator rank {self.rank} of {self.world_size}: "
                f"{self.nodes} node(s), local rank {self.local_rank} of {self.local_size}>")

