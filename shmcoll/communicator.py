"""Communicator: argument checking and dispatch to the engine; no data loops here."""
import operator
import os
import time
import weakref

import numpy as np

from shmcoll import _engine, calibration, segment, selector
from shmcoll.config import EngineParams, get
from shmcoll.cuda import is_device_array
from shmcoll.errors import SegmentError
from shmcoll.ops import OP_CODES, op_code


def _op(op):
    try:
        return OP_CODES[op]
    except (KeyError, TypeError):
        return op_code(op)


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
_ENGINES = weakref.WeakSet()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [e.disown() for e in list(_ENGINES)])


class Communicator:
    """A group of `world_size` ranks on this machine sharing one segment.

    Collectives must be called by every rank in the same order with matching
    arguments.  After a collective raises (timeout, lost peer) the communicator is
    unusable: its channels are mid-stream.  Inputs that are not C-contiguous are
    copied; ``out`` must be a C-contiguous, writeable array of the result's shape
    and dtype, and ``out=x`` (allreduce) works in place.
    """

    def __init__(self, engine, rules=None, timeout=None):
        self._engine = engine
        self._timeout = get("SHMCOLL_TIMEOUT") if timeout is None else timeout
        self._device_path = None
        self.rank = engine.rank
        self.world_size = engine.world_size
        self._rules = rules or selector.Rules()
        self._model, self.model_source = calibration.model_for(self.world_size)
        self._debug = str(get("SHMCOLL_DEBUG")).upper() in ("INFO", "TRACE")
        engine.choose = self._choose
        _ENGINES.add(engine)

    def _decide(self, collective, nbytes, algo=None):
        """The selector's decision for this communicator (model and overrides)."""
        if algo is not None and not isinstance(algo, str):
            raise ValueError(f"algo must be an algorithm name, 'auto' or None, got {algo!r}")
        return selector.decide(collective, self.world_size, nbytes, algo, self._model,
                               self._rules)

    def _choose(self, collective, world, nbytes, algo):
        """Engine code for a call (the engine caches it per size and algo): `algo` if
        named (its best variant for the size), else the SHMCOLL_ALGO rule covering
        the size, else the cost model's argmin."""
        decision = self._decide(collective, nbytes, algo)
        if self._debug:
            selector.log_decision(self.rank, collective, world, nbytes, decision)
        return decision.candidate.code

    def algorithm_for(self, collective, nbytes, algo=None, device=False):
        """What a call of `collective` on nbytes (see shmcoll.selector) runs here, as
        'algorithm' or 'algorithm (variant)'; device=True: for device arrays."""
        if device:
            return self._device().algorithm_for(collective, nbytes, algo)
        return self._decide(collective, nbytes, algo).candidate.label

    def _device(self):
        """The GPU path (shmcoll.cuda), set up at the first device array."""
        if self._device_path is None:
            if self.closed:
                self._engine.barrier()      # raises ClosedError
            from shmcoll.cuda.path import DevicePath
            self._device_path = DevicePath(self)
        return self._device_path

    def synchronize(self):
        """Wait until this rank's collectives on device arrays have finished on the
        device, and raise any error a device-side wait recorded (the GPU path runs
        asynchronously on the current CUDA stream).  A no-op for numpy arrays."""
        if self._device_path is not None:
            self._device_path.synchronize()

    # -- collectives -------------------------------------------------------
    def allreduce(self, x, out=None, op="sum", algo=None):
        """Reduce x over all ranks; every rank gets the result (same shape and dtype).
        out=x works in place."""
        try:    # the hot path: one dict lookup for the common op names
            code = OP_CODES[op]
        except (KeyError, TypeError):
            code = op_code(op)
        if type(x) is not np.ndarray and is_device_array(x):
            return self._device().allreduce(x, out, code, algo)
        return self._engine.allreduce(x, out, code, algo)

    def reduce(self, x, out=None, op="sum", root=0, algo=None):
        """Reduce x over all ranks into `root`: returns the result there, None elsewhere."""
        if is_device_array(x):
            return self._device().reduce(x, out, _op(op), _root(root, self.world_size), algo)
        return self._engine.reduce(x, out, _op(op), _root(root, self.world_size), algo)

    def reduce_scatter(self, x, out=None, op="sum", algo=None):
        """Reduce x over all ranks; rank r gets rows [r*m, (r+1)*m) of the result,
        where m = x.shape[0] // world_size (x.shape[0] must be divisible)."""
        if is_device_array(x):
            return self._device().reduce_scatter(x, out, _op(op), algo)
        return self._engine.reduce_scatter(x, out, _op(op), algo)

    def allgather(self, x, out=None, algo=None):
        """Every rank gets the stack of all ranks' x: shape (world_size, *x.shape)."""
        if is_device_array(x):
            return self._device().allgather(x, out, algo)
        return self._engine.allgather(x, out, algo)

    def gather(self, x, out=None, root=0, algo=None):
        """`root` gets the stack of all ranks' x, shape (world_size, *x.shape); other
        ranks get None."""
        if is_device_array(x):
            return self._device().gather(x, out, _root(root, self.world_size), algo)
        return self._engine.gather(x, out, _root(root, self.world_size), algo)

    def scatter(self, x, out=None, root=0, algo=None):
        """Row r of the root's x, shape (world_size, *s), goes to rank r.  Other ranks
        pass x=None and `out` (their receive buffer of shape s), or an x of the
        root's shape and dtype (only its shape is used) to have out allocated."""
        if is_device_array(x) or (x is None and is_device_array(out)):
            return self._device().scatter(x, out, _root(root, self.world_size), algo)
        return self._engine.scatter(x, out, _root(root, self.world_size), algo)

    def broadcast(self, x, root=0, algo=None):
        """Copy the root's x into x on every rank (in place; x must be a writeable,
        C-contiguous array of the same size everywhere).  Returns x."""
        if is_device_array(x):
            return self._device().broadcast(x, _root(root, self.world_size), algo)
        return self._engine.broadcast(x, _root(root, self.world_size), algo)

    def barrier(self):
        """Return once every rank has entered the barrier."""
        self._engine.barrier()

    # -- lifecycle ---------------------------------------------------------
    @property
    def closed(self):
        return self._engine.closed

    def close(self):
        """Leave the job.  Peers still waiting for this rank get PeerLostError.  With
        device buffers set up, every rank must close (they are freed only once no
        peer has them open)."""
        if self._device_path is not None and not self.closed:
            self._device_path.close()
        self._engine.close(failed=False)

    def _fail(self):
        """Leave the job because this rank failed: peers stop waiting for it."""
        if self._device_path is not None and not self.closed:
            self._device_path.close(failed=True)
        self._engine.close(failed=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._fail()
        return False

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<shmcoll.Communicator rank {self.rank} of {self.world_size}, {state}>"


def _join(seg, name, rank, world, token, params, grace=0.0):
    """Attach to a mapped segment, wait for every rank, then unlink the name.

    With a grace (join mode without a launch instance id) the name stays visible that
    long after the job formed, and rank 0 unlinks it after: a second job arriving
    under the same name meanwhile (a second rank 0, a rank already taken) refuses
    this one on every rank before any rank returns, rather than let two launches form
    jobs out of each other's ranks."""
    rules = selector.parse_overrides(get("SHMCOLL_ALGO"))
    engine = _engine.Engine(seg, rank, world, token, params)
    try:
        if engine.completed_attach and not grace:
            segment.unlink(name)
        engine.wait_attached()
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
    seg = segment.open_existing(name)
    if seg is None:
        raise SegmentError(f"the job's shared segment {name} does not exist")
    return _join(seg, name, rank, world, token, params)


def init(rank=None, world_size=None, job=None, timeout=None, bind=None):
    """Join a job by name, for processes started by anything else.

    Defaults come from SHMCOLL_RANK, SHMCOLL_WORLD_SIZE and SHMCOLL_JOB.  All
    processes passing the same job name (and launch instance, SHMCOLL_JOB_INSTANCE or
    the launcher's id) form one communicator; rank 0 creates the shared segment and
    the others wait for it (up to the timeout).  Without an instance id a formed job
    keeps its name visible SHMCOLL_JOIN_GRACE seconds before returning, so that two
    jobs started at once under one name are refused rather than mixed.  `bind` pins this
    rank as launch(bind=...) would ("core", "llc", "numa"; see shmcoll.topology).
    """
    rank = get("SHMCOLL_RANK") if rank is None else rank
    world_size = get("SHMCOLL_WORLD_SIZE") if world_size is None else world_size
    job = get("SHMCOLL_JOB") if job is None else job
    if rank is None or world_size is None or job is None:
        raise ValueError("init() needs rank, world_size and job (or SHMCOLL_RANK, "
                         "SHMCOLL_WORLD_SIZE and SHMCOLL_JOB)")
    rank, world_size, job = int(rank), int(world_size), str(job)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not job:
        raise ValueError("job name must not be empty")
    params = EngineParams.from_env(world_size, timeout)
    if bind is not None:
        from shmcoll import topology
        topology.bind_self(topology.placement(topology.discover(), world_size, bind)[rank])
    instance = segment.launch_instance()
    name, token = segment.job_identity(job, instance)
    grace = 0.0 if instance is not None or world_size == 1 else get("SHMCOLL_JOIN_GRACE")
    if rank == 0:
        seg = segment.create_for_job(name, world_size, params, token)
    else:
        # a world size other than the job's is refused by the attach, which tells
        # every rank of the job at once
        seg = segment.wait_for_job(name, params.timeout)
    return _join(seg, name, rank, world_size, token, params, grace)
