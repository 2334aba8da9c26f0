"""Communicator: argument checking and dispatch to the engine; no data loops here."""
from __future__ import annotations

import atexit
import dataclasses
import operator
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from shmcoll import _engine
from shmcoll._core import launchers, segment
from shmcoll._core.settings import EngineParams, get
from shmcoll import arrays, ragged
from shmcoll.arrays import is_device_array
from shmcoll.errors import SegmentError
from shmcoll.ops import OP_CODES, op_code
from shmcoll.tuning import calibration, selector
from shmcoll.tuning.decider import Decider
from shmcoll.work import Work

if TYPE_CHECKING:
    from shmcoll.ops import ReduceOp

# A numpy array, a torch tensor, anything with __dlpack__, the buffer protocol or
# __array_interface__, or a device array (CuPy's, a CUDA tensor): shmcoll.arrays.
Array = Any
Op = Union[str, "ReduceOp"]


def _op(op):
    try:
        return OP_CODES[op]
    except (KeyError, TypeError):
        return op_code(op)


# The engine takes numpy arrays as they are; every method checks for them inline, as
# `type(x) is _ND and (out is None or type(out) is _ND)` (a call or a tuple more costs
# a small call a few percent).
_ND = np.ndarray


ANY_TAG = _engine.ANY_TAG      # a recv that takes the next message from its source


def _tag(tag, receiving=False):
    """A message tag: an integer >= 0 (a receive may pass ANY_TAG)."""
    tag = _integer(tag, "tag")
    if tag < 0 and not (receiving and tag == ANY_TAG):
        raise ValueError(f"tag must be >= 0{' or ANY_TAG' if receiving else ''}, got {tag}")
    if tag >= _TAG_LIMIT:
        raise ValueError(f"tag must be below 2**62, got {tag}")
    return tag


_TAG_LIMIT = 1 << 62


_SPLIT_NONE = -2         # split()'s header: this rank passed color=None


def _integer(value, what):
    """An integer argument (bool is not one) as an int, else TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None


def _nonnegative(value, what):
    value = _integer(value, what)
    if value < 0:
        raise ValueError(f"{what} must be >= 0 (or None), got {value}")
    return value


def _root(root, world):
    """`root` as a rank of a job of `world` ranks: an integer (bool is not a rank) in
    range, else TypeError / ValueError before anything is published."""
    if type(root) is not int:
        if isinstance(root, bool):
            raise TypeError(f"root must be an integer rank, got {root!r}")
        try:
            root = operator.index(root)
        except TypeError:
            raise TypeError(f"root must be an integer rank, got {root!r}") from None
    if not 0 <= root < world:
        raise ValueError(f"root {root} is out of range for world size {world}")
    return root


# A forked child inherits the mapping but is not the rank: its copies are disowned at
# fork time, so using one raises instead of corrupting the parent's channels.
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [e.disown() for e in list(_ENGINES)])


@atexit.register
def _finish_at_exit():
    """A process that ends without waiting for its nonblocking calls still completes
    them: its peers run the same calls and must not be left with a rank gone mid-call."""
    for engine in list(_ENGINES):
        try:
            engine.finish_works()
        except BaseException:   # (at exit: the works hold their own errors)
            pass


def _forget_symmetric(engine_ref, number):
    engine = engine_ref()
    if engine is not None:
        engine.remove_symmetric(number)


class Communicator:
    """A group of `world_size` ranks on this machine sharing one segment.

    Collectives must be called by every rank in the same order with matching
    arguments.  After a collective raises (timeout, lost peer) the communicator is
    unusable: its channels are mid-stream.  Inputs that are not C-contiguous are
    copied; ``out`` must be a C-contiguous, writeable array of the result's shape
    and dtype, and ``out=x`` (allreduce) works in place.

    Every collective takes ``async_op``: with True its arguments are checked at once
    and it returns a shmcoll.Work; it runs on the communicator's progress thread while
    the caller goes on, and ``work.wait()`` returns what the blocking call would have
    (see shmcoll.work for what the caller must leave alone meanwhile).
    """

    def __init__(self, engine: Any, rules: Optional[selector.Rules] = None,
                 timeout: Optional[float] = None) -> None:
        self._engine = engine
        self._timeout = get("SHMCOLL_TIMEOUT") if timeout is None else timeout
        self._device_path = None
        self._splits = 0        # split() calls so far: part of each child's name
        self._symmetric_count = 0   # symmetric allocations so far: each one's number
        self._symmetric = None      # their deciders, made at the first
        self.rank: int = engine.rank
        self.world_size: int = engine.world_size
        self._rules = rules or selector.Rules()
        model, self.model_source = calibration.model_for(self.world_size)
        variants = None
        if engine.cross_memory is not None:     # every rank reaches every other: price cma
            model = dataclasses.replace(model, cross_memory=engine.cross_memory,
                                        ranks_per_cpu=_ranks_per_cpu(self.world_size))
            variants = selector.cross_memory_variants(self.world_size)
        debug = str(get("SHMCOLL_DEBUG")).upper() in ("INFO", "TRACE")
        engine.decider = Decider(self.world_size, model, self._rules, variants,
                                 log_rank=self.rank if debug else None,
                                 agree=self._slowest if _tuning(self.world_size) else None)
        _ENGINES.add(engine)

    def _slowest(self, seconds: Sequence[float]) -> List[float]:
        """Each entry's maximum over the ranks (a trial's agreement, tuning.trials)."""
        values = np.asarray(seconds, np.float64)
        return self._engine.allreduce(values, None, OP_CODES["max"], "direct", False).tolist()

    @property
    def cross_memory(self) -> Optional[Tuple[float, float, float, float]]:
        """None unless every rank may read and write every other's memory with
        cross-memory attach (probed at creation; SHMCOLL_CMA): then (seconds of a small
        read; ρ: a read of bytes a peer has just written over the same bytes' two copies
        through a channel; ρ again for bytes this rank read before and the peer left
        unchanged; ω: a write of bytes in this rank's cache into a peer's, over the same
        two copies) as rank 0 measured them with rank 1, and the cost model prices
        algorithm "cma" — single copy of ordinary arrays — beside the channel schedules
        (tuning.algorithms.cma)."""
        return self._engine.cross_memory

    def algorithm_for(self, collective: str, nbytes: int, algo: Optional[str] = None,
                      device: bool = False, symmetric: Optional[str] = None) -> str:
        """What a call of `collective` on nbytes (priced as in shmcoll.collectives) runs
        here, as 'algorithm' or 'algorithm (variant)' (where a trial settled the size
        class, its winner; see shmcoll.tuning.trials); device=True: for device arrays;
        symmetric: for an x in a symmetric allocation, with out "plain", "symmetric"
        or "in place" (see empty; only AllReduce tells them apart)."""
        return self._decider_for(device, symmetric, collective).label(collective, nbytes, algo)

    def calls_until_settled(self, collective: str, nbytes: int, algo: Optional[str] = None,
                            device: bool = False, symmetric: Optional[str] = None) -> int:
        """Blocking calls of this size (arguments as algorithm_for) still to make before
        what it runs is final: while a trial settles its size class (tuning.trials),
        its first calls run the candidates in turn.  0 where none runs or it settled.
        A benchmark warms up with this many calls more, or it times the candidates."""
        return self._decider_for(device, symmetric, collective).calls_until_settled(
            collective, nbytes, algo)

    def _decider_for(self, device, symmetric, collective):
        """The Decider of a call's path: device arrays, an x in a symmetric allocation
        with out as `symmetric` says (see algorithm_for), or the CPU engine."""
        if symmetric is not None:
            if symmetric not in _engine.SYMMETRIC_OUT_CASES:
                raise ValueError(f"symmetric must be one of {', '.join(_engine.SYMMETRIC_OUT_CASES)}"
                                 f" or None, got {symmetric!r}")
            if collective != "allreduce":   # the engine reads out's place for AllReduce only
                symmetric = "plain"
            return self._symmetric_deciders()[symmetric]
        return self._decider(device)

    def _decider(self, device=False):
        """The Decider of the CPU engine or (device=True) of the GPU path."""
        return self._device().decider if device else self._engine.decider

    def _device(self):
        """The GPU path (shmcoll.cuda), set up at the first device array."""
        if self._device_path is None:
            if self.closed:
                self._engine.barrier()      # raises ClosedError
            from shmcoll.cuda.path import DevicePath
            self._device_path = DevicePath(self._engine, self._rules, self._timeout)
        return self._device_path

    # -- symmetric allocations ---------------------------------------------
    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A new array in the job's shared memory, the same allocation on every rank
        (collective: every rank passes the same shape and dtype, in call order).

        Collectives whose x is such an array (or a view of it at the same place on every
        rank) read the peers' arrays where they lie instead of copying them through the
        channels (shmcoll.symmetric; the selector prices both).  x and out must be
        symmetric on every rank or on none (else MismatchError).  AllReduce in place
        (out=x) and with a symmetric out may run two-shot.  The ordering rule: a rank
        writes its array before the call and may write it again once the call returned
        (peers finished reading it by then).  The memory is freed once no array of the
        allocation is left on any rank."""
        from shmcoll import symmetric
        if self.closed:
            self._engine.barrier()      # raises ClosedError
        if self._engine.symmetric_decide is None:
            deciders = {_engine.SYMMETRIC_OUT_CASES[name]: d
                        for name, d in self._symmetric_deciders().items()}
            self._engine.symmetric_decide = \
                lambda coll, nbytes, algo, case, blocking: \
                deciders[case].choose(coll, nbytes, algo, blocking)
        allocation, shape, dt = symmetric.allocate(self, shape, dtype, self._symmetric_count)
        self._symmetric_count += 1
        self._engine.add_symmetric(allocation.base, allocation.stride, allocation.number)
        # The mapping lives as long as an array of it; the engine forgets it first.
        weakref.finalize(allocation.mapping, _forget_symmetric, weakref.ref(self._engine),
                         allocation.number)
        return allocation.array(self.rank, shape, dt)

    def zeros(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """empty(), filled with zeros (a new segment's pages are zero already)."""
        return self.empty(shape, dtype)

    def _symmetric_deciders(self):
        """What calls with a symmetric x run: a Decider per place of out, by name."""
        if self._symmetric is None:
            decider = self._engine.decider
            self._symmetric = {
                name: Decider(self.world_size, decider.model, self._rules,
                              selector.symmetric_variants(self.world_size, name,
                                                          self.cross_memory is not None),
                              log_rank=decider.log_rank, agree=decider.agree)
                for name in _engine.SYMMETRIC_OUT_CASES}
        return self._symmetric

    def synchronize(self) -> None:
        """Wait until this rank's collectives on device arrays have finished on the
        device, and raise any error a device-side wait recorded (the GPU path runs
        asynchronously on the current CUDA stream).  A no-op for numpy arrays."""
        if self._device_path is not None:
            self._device_path.synchronize()

    # -- collectives -------------------------------------------------------
    # numpy arrays go straight to the engine; anything else through _any.
    def allreduce(self, x: Array, out: Optional[Array] = None, op: Op = "sum",
                  algo: Optional[str] = None, async_op: bool = False) -> Union[Array, Work]:
        """Reduce x over all ranks; every rank gets the result (same shape and dtype).
        out=x works in place."""
        try:    # the hot path: one dict lookup for the common op names
            code = OP_CODES[op]
        except (KeyError, TypeError):
            code = op_code(op)
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.allreduce(x, out, code, algo, async_op)
        return self._any("allreduce", x, out, (code, algo), async_op)

    def reduce(self, x: Array, out: Optional[Array] = None, op: Op = "sum", root: int = 0,
               algo: Optional[str] = None, async_op: bool = False) -> Union[Array, Work, None]:
        """Reduce x over all ranks into `root`: returns the result there, None elsewhere."""
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.reduce(x, out, _op(op), _root(root, self.world_size), algo,
                                       async_op)
        return self._any("reduce", x, out, (_op(op), _root(root, self.world_size), algo),
                         async_op)

    def reduce_scatter(self, x: Array, out: Optional[Array] = None, op: Op = "sum",
                       algo: Optional[str] = None, async_op: bool = False,
                       counts: Optional[Sequence[int]] = None) -> Union[Array, Work]:
        """Reduce x over all ranks; rank r gets rows [r*m, (r+1)*m) of the result,
        where m = x.shape[0] // world_size (x.shape[0] must be divisible).  With
        `counts` (the same on every rank), blocks are uneven: rank r gets rows
        [sum(counts[:r]), sum(counts[:r+1])) (a new array; see shmcoll.ragged)."""
        if counts is not None:
            if out is not None or async_op:
                raise ValueError("reduce_scatter with counts takes neither out nor async_op")
            return ragged.reduce_scatter_counts(self, arrays.as_numpy(x), counts, op, algo)
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.reduce_scatter(x, out, _op(op), algo, async_op)
        return self._any("reduce_scatter", x, out, (_op(op), algo), async_op)

    def allgather(self, x: Array, out: Optional[Array] = None,
                  algo: Optional[str] = None, async_op: bool = False) -> Union[Array, Work]:
        """Every rank gets the stack of all ranks' x: shape (world_size, *x.shape)."""
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.allgather(x, out, algo, async_op)
        return self._any("allgather", x, out, (algo,), async_op)

    def gather(self, x: Array, out: Optional[Array] = None, root: int = 0,
               algo: Optional[str] = None, async_op: bool = False) -> Union[Array, Work, None]:
        """`root` gets the stack of all ranks' x, shape (world_size, *x.shape); other
        ranks get None."""
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.gather(x, out, _root(root, self.world_size), algo, async_op)
        return self._any("gather", x, out, (_root(root, self.world_size), algo), async_op)

    def scatter(self, x: Optional[Array], out: Optional[Array] = None, root: int = 0,
                algo: Optional[str] = None, async_op: bool = False) -> Union[Array, Work]:
        """Row r of the root's x, shape (world_size, *s), goes to rank r.  Other ranks
        pass x=None and `out` (their receive buffer of shape s), or an x of the
        root's shape and dtype (only its shape is used) to have out allocated."""
        if (x is None or type(x) is _ND) and (out is None or type(out) is _ND):
            return self._engine.scatter(x, out, _root(root, self.world_size), algo, async_op)
        return self._any("scatter", x, out, (_root(root, self.world_size), algo), async_op)

    def broadcast(self, x: Array, root: int = 0, algo: Optional[str] = None,
                  async_op: bool = False) -> Union[Array, Work]:
        """Copy the root's x into x on every rank (in place; x must be a writeable,
        C-contiguous array of the same size everywhere).  Returns x."""
        root = _root(root, self.world_size)
        if type(x) is _ND:
            return self._engine.broadcast(x, root, algo, async_op)
        if is_device_array(x):
            return self._on_device(self._device().broadcast(x, root, algo), async_op)
        xa = arrays.as_out(x, "x")      # written in place: the caller's own memory
        got = self._engine.broadcast(xa, root, algo, async_op)
        return arrays.in_kind_of(got, async_op, x, xa, None, None)

    def alltoall(self, x: Array, out: Optional[Array] = None, algo: Optional[str] = None,
                 async_op: bool = False) -> Union[Array, Work]:
        """x has shape (world_size, *s); rank r gets row r of every rank's x, stacked
        in rank order (shape (world_size, *s)).  out must not overlap x."""
        if type(x) is _ND and (out is None or type(out) is _ND):
            return self._engine.alltoall(x, out, algo, async_op)
        return self._any("alltoall", x, out, (algo,), async_op)

    def alltoallv(self, x: Array, counts: Sequence[int],
                  recv_counts: Optional[Sequence[int]] = None, out: Optional[Array] = None,
                  async_op: bool = False) -> Union[np.ndarray, Work]:
        """Rank r sends rows [sum(counts[:q]), sum(counts[:q+1])) of x to rank q and
        gets the rows each rank sent it, concatenated in rank order.  The counts are
        exchanged (and checked) by the call; recv_counts, if passed, must agree.
        Rows are x's first dimension; the others must agree on every rank."""
        xa, oa = arrays.as_numpy(x), arrays.as_out(out)
        got = ragged.alltoallv(self, xa, counts, recv_counts, oa, async_op)
        return arrays.in_kind_of(got, async_op, x, xa, out, oa)

    # -- point-to-point ------------------------------------------------------
    def send(self, x: Array, dst: int, tag: int = 0,
             async_op: bool = False) -> Optional[Work]:
        """Send x to rank `dst`, where a recv with this tag (or ANY_TAG) takes it.
        Returns once x is in the channel (at once for a message that fits its free
        slots); a larger one waits for the receiver (use sendrecv or async_op for
        exchanges; to this rank itself it is refused, as nothing could receive it).
        With async_op the Work completes once x is in the channel, whatever the calls
        issued before it do.  Messages to one rank arrive in order."""
        if not (type(x) is _ND and type(dst) is int and 0 <= dst < self.world_size and
                type(tag) is int and 0 <= tag < _TAG_LIMIT):
            x, dst, tag = self._message(x), self._peer(dst, "dst"), _tag(tag)
        return self._engine.p2p([("send", dst, tag, x)], None, async_op)

    def recv(self, out: Array, src: int, tag: int = 0,
             async_op: bool = False) -> Union[Array, Work]:
        """Receive into `out` the first message from rank `src` with this tag
        (ANY_TAG: any); its size and dtype must be out's, else MismatchError (the
        message is dropped; the communicator stays usable).  Returns out."""
        if (type(out) is _ND and type(src) is int and 0 <= src < self.world_size and
                type(tag) is int and 0 <= tag < _TAG_LIMIT):
            return self._engine.p2p([("recv", src, tag, out)], out, async_op)
        oa = self._receive_buffer(out)
        got = self._engine.p2p([("recv", self._peer(src, "src"), _tag(tag, True), oa)], oa,
                               async_op)
        return arrays.in_kind_of(got, async_op, None, None, out, oa)

    def sendrecv(self, x: Array, dst: int, out: Optional[Array] = None,
                 src: Optional[int] = None, tag: int = 0, recv_tag: Optional[int] = None,
                 async_op: bool = False) -> Union[Array, Work]:
        """Send x to `dst` while receiving from `src` (default: dst) into `out`
        (default: a new array like x), the two progressing together, so ranks that
        exchange with each other cannot deadlock.  Returns out."""
        xa = self._message(x)
        oa = np.empty_like(xa) if out is None else self._receive_buffer(out)
        src = dst if src is None else src
        recv_tag = tag if recv_tag is None else recv_tag
        got = self._engine.p2p([("send", self._peer(dst, "dst"), _tag(tag), xa),
                                ("recv", self._peer(src, "src"), _tag(recv_tag, True), oa)],
                               oa, async_op)
        return arrays.in_kind_of(got, async_op, x, xa, out, oa)

    def _peer(self, rank, what):
        try:
            return _root(rank, self.world_size)
        except (TypeError, ValueError) as e:
            raise type(e)(str(e).replace("root", what, 1)) from None

    @staticmethod
    def _receive_buffer(out):
        """The memory a message is received into (the engine checks that it is
        writeable and C-contiguous: written in place, never through a copy)."""
        if out is None:
            raise TypeError("recv needs out, the array the message is received into")
        return arrays.as_out(out)

    @staticmethod
    def _message(x):
        return arrays.as_numpy(x)

    def _any(self, name, x, out, args, async_op):
        """A collective on anything but numpy arrays: device memory goes to the GPU
        path; host memory (tensors, DLPack, buffers) to the engine as numpy views of
        it, and the result comes back in the caller's kind (shmcoll.arrays)."""
        if is_device_array(x) or (x is None and is_device_array(out)):
            if not hasattr(type(self._device()), name):
                raise TypeError(f"{name} is not available for device arrays: pass host "
                                f"arrays (numpy, CPU tensors)")
            return self._on_device(getattr(self._device(), name)(x, out, *args), async_op)
        xa = None if x is None else arrays.as_numpy(x)
        oa = arrays.as_out(out)
        got = getattr(self._engine, name)(xa, oa, *args, async_op)
        return arrays.in_kind_of(got, async_op, x, xa, out, oa)

    # -- uneven blocks and Python objects (shmcoll.ragged: compositions of the above) --
    def allgatherv(self, x: Array) -> np.ndarray:
        """Every rank gets the concatenation, in rank order, of every rank's x, whose
        first dimensions may differ (the others must agree)."""
        return ragged.allgatherv(self, arrays.as_numpy(x))

    def gatherv(self, x: Array, root: int = 0) -> Optional[np.ndarray]:
        """allgatherv's concatenation on `root`; None elsewhere."""
        return ragged.gatherv(self, arrays.as_numpy(x), _root(root, self.world_size))

    def scatterv(self, x: Optional[Array], counts: Optional[Sequence[int]] = None,
                 root: int = 0) -> np.ndarray:
        """Rank r gets rows [sum(counts[:r]), sum(counts[:r+1])) of the root's x (x and
        counts are read on the root only)."""
        root = _root(root, self.world_size)
        x = arrays.as_numpy(x) if self.rank == root else None
        return ragged.scatterv(self, x, counts, root)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """The root's picklable object on every rank (unpickling runs code the root
        sent: for the ranks of one job, which trust each other)."""
        return ragged.broadcast_object(self, obj, _root(root, self.world_size))

    def allgather_object(self, obj: Any) -> List[Any]:
        """Every rank's object, in rank order, on every rank."""
        return ragged.allgather_object(self, obj)

    def gather_object(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        """Every rank's object, in rank order, on `root`; None elsewhere."""
        return ragged.gather_object(self, obj, _root(root, self.world_size))

    def scatter_object(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        """objs[r] of the root's sequence on rank r (objs is read on the root only)."""
        return ragged.scatter_object(self, objs, _root(root, self.world_size))

    # -- sub-communicators ------------------------------------------------------
    def split(self, color: Optional[int], key: Optional[int] = None) -> Optional[Communicator]:
        """A new communicator of the ranks passing the same `color` (an integer >= 0),
        ranked by `key` (default 0) then by rank here, as MPI's Comm_split; None for
        color=None (this rank joins none).  Every rank of this communicator must call
        it.  The new communicator has a shared segment of its own: it shares nothing
        with this one or its siblings, and either may be closed first."""
        P, error, order = self.world_size, None, 0
        head = np.zeros(4, np.int64)
        try:
            color = None if color is None else _nonnegative(color, "color")
            order = 0 if key is None else _integer(key, "key")
            head[:] = (_SPLIT_NONE if color is None else color, order, 0, 0)
        except (TypeError, ValueError, OverflowError) as e:
            error, head[0] = e, ragged._REFUSED
        head[2] = int.from_bytes(os.urandom(7), "little")     # rank 0's names the split
        heads = np.asarray(self.allgather(head))
        ragged._refuse_together([q for q in range(P) if heads[q, 0] == ragged._REFUSED],
                                "split", error)
        self._splits += 1
        if color is None:
            return None
        members = sorted((int(heads[q, 1]), q) for q in range(P) if heads[q, 0] == color)
        rank = members.index((order, self.rank))
        job = f"split-{int(heads[0, 2]):x}-{self._splits}-{color}"
        return join(rank, len(members), job, job, self._timeout)

    def barrier(self, async_op: bool = False) -> Optional[Work]:
        """Return once every rank has entered the barrier (async_op: a Work that
        completes then)."""
        return self._engine.barrier(async_op)

    def _on_device(self, result, async_op):
        """A device call is already asynchronous on the current stream: as a Work,
        waiting for it is synchronising with that point of the stream."""
        return self._device_path.work(result) if async_op else result

    # -- lifecycle ---------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._engine.closed

    def close(self) -> None:
        """Leave the job, once the nonblocking calls issued so far have completed (or
        failed).  Peers still waiting for this rank get PeerLostError.  With device
        buffers set up, every rank must close (they are freed only once no peer has
        them open)."""
        if self._device_path is not None and not self.closed:
            self._device_path.close()
        self._engine.close(failed=False)

    def _fail(self):
        """Leave the job because this rank failed: peers stop waiting for it."""
        if self._device_path is not None and not self.closed:
            self._device_path.close(failed=True)
        self._engine.close(failed=True)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc_type is None:
            self.close()
        else:
            self._fail()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<shmcoll.Communicator rank {self.rank} of {self.world_size}, {state}>"


def _tuning(world):
    """Whether trials settle the model's close calls (tuning.trials): unless turned
    off, where every rank has a usable CPU of its own.  Where ranks outnumber them, a
    call's time depends on how the scheduler interleaves the ranks more than on the
    schedule, and a dozen calls do not measure it (measured at 4 ranks on 2 cores:
    trials picked schedules 1.1-1.5x slower than the model's choice at 5-6 sizes of
    12); the model's fit for such jobs was made under the same conditions."""
    from shmcoll._core.topology import job_cpus
    mode = str(get("SHMCOLL_TUNE")).strip().lower()
    if mode not in ("auto", "off"):
        raise ValueError(f"SHMCOLL_TUNE must be 'auto' or 'off', got {mode!r}")
    return mode == "auto" and world <= job_cpus()


def _ranks_per_cpu(world):
    """The job's ranks over its usable CPUs where they outnumber them, else 1 (the
    same on every rank, however each is bound): rank 0 measured cross-memory costs
    with one reader alone on its core, and where ranks outnumber the CPUs the ranks'
    reads queue for the same cores (tuning.algorithms.cma)."""
    from shmcoll._core.topology import job_cpus
    return max(1.0, world / max(1, job_cpus()))


def _join_settings():
    """The settings a joining rank reads: (SHMCOLL_ALGO's rules, whether SHMCOLL_CMA
    allows cross-memory attach).  Read before the segment is created or opened, so
    that a bad value fails without leaving a segment name behind."""
    rules = selector.parse_overrides(get("SHMCOLL_ALGO"))
    cma = get("SHMCOLL_CMA").strip().lower()
    if cma not in ("auto", "off"):
        raise ValueError(f"SHMCOLL_CMA must be 'auto' or 'off', got {cma!r}")
    return rules, cma == "auto"


def _join(seg, name, rank, world, token, params, settings, grace=0.0):
    """Attach to a mapped segment, wait for every rank, then unlink the name.

    With a grace (join mode without a launch instance id) the name stays visible that
    long after the job formed, and rank 0 unlinks it after: a second job arriving
    under the same name meanwhile (a second rank 0, a rank already taken) refuses
    this one on every rank before any rank returns, rather than let two launches form
    jobs out of each other's ranks."""
    rules, cma_allowed = settings
    engine = _engine.Engine(seg, rank, world, token, params)
    try:
        if engine.completed_attach and not grace:
            segment.unlink(name)
        engine.wait_attached()
        engine.agree_cross_memory(cma_allowed)
        if grace:
            time.sleep(grace)
            refused = seg.refusal()
            if refused is not None:
                raise refused
            if rank == 0:
                segment.unlink_if_ours(name, seg)
    except BaseException:
        engine.close(failed=True)
        segment.unlink_if_ours(name, seg)
        raise
    return Communicator(engine, rules, params.timeout)


def attach(name, rank, world, token, params):
    """Launch mode: the segment already exists (created by the launcher)."""
    settings = _join_settings()
    seg = segment.open_existing(name)
    if seg is None:
        raise SegmentError(f"the job's shared segment {name} does not exist")
    return _join(seg, name, rank, world, token, params, settings)


def init(rank: Optional[int] = None, world_size: Optional[int] = None, job: Optional[str] = None,
         timeout: Optional[float] = None, bind: Optional[str] = None) -> Communicator:
    """Join a job by name, for processes started by anything else.

    What is not passed comes from SHMCOLL_RANK, SHMCOLL_WORLD_SIZE and SHMCOLL_JOB,
    else from the environment of the launcher that started the process (shmcoll run,
    torchrun, Open MPI's mpirun, MPICH's mpiexec/PMI, Slurm's srun; the order and the
    variables: shmcoll._core.launchers), whose job id names the job.  All processes
    passing the same job name (and launch instance: the launcher's id or
    SHMCOLL_JOB_INSTANCE) form one communicator; rank 0 creates the shared segment and
    the others wait for it (up to the timeout).  Without an instance id a formed job
    keeps its name visible SHMCOLL_JOIN_GRACE seconds before returning, so that two
    jobs started at once under one name are refused rather than mixed.  `bind` pins this
    rank as launch(bind=...) would ("core", "llc", "numa"; see shmcoll._core.topology).
    """
    rank = get("SHMCOLL_RANK") if rank is None else rank
    world_size = get("SHMCOLL_WORLD_SIZE") if world_size is None else world_size
    job = get("SHMCOLL_JOB") if job is None else job
    instance = segment.launch_instance()
    if rank is None or world_size is None or job is None:
        launch = launchers.detect()
        if launch is not None:
            rank = launch.rank if rank is None else rank
            world_size = launch.world_size if world_size is None else world_size
            if job is None:
                job, instance = launch.job, launch.instance
            elif instance is None:
                instance = launch.instance
    if rank is None or world_size is None or job is None:
        raise ValueError("init() needs rank, world_size and job: pass them, set "
                         "SHMCOLL_RANK, SHMCOLL_WORLD_SIZE and SHMCOLL_JOB, or start the "
                         "processes with a launcher (shmcoll run, torchrun, mpirun, srun)")
    return join(int(rank), int(world_size), str(job), instance, timeout, bind)


def join(rank: int, world_size: int, job: str, instance: Optional[str],
         timeout: Optional[float] = None, bind: Optional[str] = None,
         machine_ranks: Optional[int] = None) -> Communicator:
    """init() with every argument given: `instance` is the launch's id (None: none,
    so a formed job keeps its name visible SHMCOLL_JOIN_GRACE seconds, see init);
    `machine_ranks`: the processes sharing this machine's cores when the job is not
    all of them (default world_size), for the choice of spinning or not."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not job:
        raise ValueError("job name must not be empty")
    settings = _join_settings()
    params = EngineParams.from_env(machine_ranks or world_size, timeout)
    if bind is not None:
        from shmcoll._core import topology
        topology.bind_self(topology.placement(topology.discover(), world_size, bind)[rank])
    name, token = segment.job_identity(job, instance)
    grace = 0.0 if instance is not None or world_size == 1 else get("SHMCOLL_JOIN_GRACE")
    if rank == 0:
        seg = segment.create_for_job(name, world_size, params, token)
    else:
        # a world size other than the job's is refused by the attach, which tells
        # every rank of the job at once
        seg = segment.wait_for_job(name, params.timeout)
    return _join(seg, name, rank, world_size, token, params, settings, grace)
