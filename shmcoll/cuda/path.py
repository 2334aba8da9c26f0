"""The GPU path of a Communicator: argument checks, the algorithm decision, a host
handshake, then one schedule (shmcoll.cuda.collectives) enqueued on the current stream.

Every call first checks, on the host, that all ranks make the same call: one
allgather of a small descriptor on the shared-memory engine, so a mismatch raises
MismatchError on every rank and a dead peer PeerLostError, before any device work.
The IPC buffers are set up at the first call (a collective step of its own).
"""
import math
from typing import Dict, Tuple

import numpy as np

from shmcoll._core.settings import get
from shmcoll.collectives import BY_NAME
from shmcoll.cuda import backend as backends
from shmcoll.cuda import kernels
from shmcoll.cuda.collectives import Schedules
from shmcoll.cuda.work import DeviceWork
from shmcoll.errors import CommunicatorBrokenError, MismatchError
from shmcoll.ops import ReduceOp
from shmcoll.tuning import calibration
from shmcoll.tuning.decider import Decider

# What the GPU path implements: {collective: {algorithm: (variant, ...)}}.
VARIANTS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "allreduce": {"direct": ("one-shot", "two-shot"), "ring": ("ring",)},
    "reduce_scatter": {"direct": ("direct",), "ring": ("ring",)},
    "allgather": {"direct": ("direct",), "ring": ("ring",)},
    "broadcast": {"direct": ("star",), "ring": ("chain",)},
    "reduce": {"direct": ("star",)},
    "gather": {"direct": ("star",)},
    "scatter": {"direct": ("star",)},
}
# Collectives of host arrays only: a device array is refused with a TypeError.
HOST_ONLY = ("alltoall",)
# (collective, algorithm, variant) -> its number in the call descriptor
_LABELS = {(c, a, v): i for i, (c, a, v) in enumerate(
    (c, a, v) for c, algs in VARIANTS.items() for a, vs in algs.items() for v in vs)}
_DESCRIPTOR = ("collective", "count", "dtype", "itemsize", "op", "root", "algorithm")


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _dtype_of(arr, cai):
    """The numpy dtype of a device array: its own when numpy understands it (CuPy's;
    bfloat16 through ml_dtypes), else the interface's typestr (e.g. a torch tensor)."""
    try:
        return np.dtype(arr.dtype)
    except (AttributeError, TypeError):
        return np.dtype(cai["typestr"])


class _DtypeInfo:
    """What a call needs of a dtype, computed once per dtype (numpy's attribute
    lookups cost microseconds each on a path that must take a few)."""
    __slots__ = ("name", "itemsize", "code")

    def __init__(self, dtype):
        self.name, self.itemsize = dtype.name, dtype.itemsize
        self.code = int.from_bytes(self.name.encode()[:8].ljust(8, b"\0"), "little", signed=True)


_DTYPES = {}


def dtype_info(dtype):
    info = _DTYPES.get(dtype)
    if info is None:
        info = _DTYPES[dtype] = _DtypeInfo(dtype)
    return info


class DeviceArray:
    """What the collectives need of an array exposing __cuda_array_interface__."""
    __slots__ = ("arr", "shape", "dtype", "info", "ptr", "readonly", "count", "nbytes")

    def __init__(self, arr, what):
        cai = arr.__cuda_array_interface__
        self.arr = arr
        self.shape = tuple(cai["shape"])
        self.dtype = _dtype_of(arr, cai)
        self.info = dtype_info(self.dtype)
        self.ptr, self.readonly = cai["data"]
        self.count = math.prod(self.shape)
        self.nbytes = self.count * self.info.itemsize
        strides = cai.get("strides")
        if strides is not None and self.count > 1 and \
                tuple(strides) != _c_strides(self.shape, self.info.itemsize):
            raise ValueError(f"{what} must be a C-contiguous device array")


MIN_BUFFER_BYTES, MAX_BUFFER_BYTES = 32 << 20, 512 << 20


def default_buffer_bytes(device_memory):
    """The staging buffer's half when SHMCOLL_CUDA_BUFFER_BYTES is unset: as large as a
    GPU's memory comfortably allows.  Every piece of a message costs a meeting of the
    ranks, and ranks sharing one GPU meet slowly (each switch between their contexts
    is ~135 us on an H200), so fewer, larger pieces: with 16 MiB halves a 1 GiB
    AllReduce at P=2 took 32.7 ms there, with 1 GiB halves 4.5 ms."""
    return max(MIN_BUFFER_BYTES, min(MAX_BUFFER_BYTES, device_memory // 256 >> 20 << 20))


class DevicePath:
    """One per Communicator, created at its first call with a device array: runs on
    the communicator's `engine` (the host handshake), decides under its override
    `rules`, and gives up a device wait after `timeout` seconds."""

    def __init__(self, engine, rules, timeout):
        self.engine = engine
        self.rank, self.world = engine.rank, engine.world_size
        self.backend = backends.load()
        half = get("SHMCOLL_CUDA_BUFFER_BYTES")
        half = default_buffer_bytes(self.backend.memory_bytes()) if half is None else int(half)
        if half < 4096:
            raise ValueError("SHMCOLL_CUDA_BUFFER_BYTES must be at least 4096")
        self.sched = Schedules(engine, self.backend, half, timeout)
        self.sync = str(get("SHMCOLL_CUDA_SYNC")).lower()
        if self.sync not in ("auto", "device", "host"):
            raise ValueError(f"SHMCOLL_CUDA_SYNC={self.sync!r}: expected auto, device or host")
        model, self.model_source = calibration.model_for(
            self.world, device=self.backend.identity().decode())
        self.decider = Decider(self.world, model, rules, VARIANTS, alone="direct")
        self._broken = None
        self._ops = {}              # (dtype, op code) -> op name, once checked
        # The call descriptor every rank publishes, and where everyone's lands.
        self._mine = np.zeros(len(_DESCRIPTOR), np.int64)
        self._everyone = np.zeros((self.world, len(_DESCRIPTOR)), np.int64)

    # -- decisions and the handshake --------------------------------------------------
    def _begin(self, collective, x, op, root, algo, nbytes, count=None):
        """Decides and agrees with every rank on the call (x's count, or `count`, and
        dtype; op as its code); returns (variant, stream)."""
        if self._broken:
            raise CommunicatorBrokenError(f"the communicator's device path failed earlier: "
                                          f"{self._broken}")
        self.backend.check()
        cand = self.decider.decide(collective, nbytes, algo).candidate
        variant = cand.variant
        mine = self._mine
        mine[:] = (BY_NAME[collective].code, x.count if count is None else count,
                   x.info.code, x.info.itemsize, -1 if op is None else op, root,
                   _LABELS[collective, cand.algorithm, variant])
        everyone = self.engine.allgather(mine, self._everyone)
        if everyone.tobytes() != mine.tobytes() * self.world:
            self._mismatch(collective, mine, everyone)
        try:
            self.sched.ensure_buffers(self.sync)
        except BaseException as e:
            self._broken = f"{type(e).__name__}: {e}"
            raise
        # One rank: whatever was named, a copy (a one-rank ring has no steps to run).
        if self.world == 1:
            variant = VARIANTS[collective]["direct"][0]
        return variant, self.backend.stream()

    def _mismatch(self, collective, mine, everyone):
        peer, i = (int(v) for v in np.argwhere(everyone != mine)[0])
        field = _DESCRIPTOR[i]
        self._broken = f"rank {peer} made another call ({field} differs)"
        raise MismatchError(f"device {collective}: rank {self.rank} and rank {peer} differ "
                            f"in {field}: {mine[i]} vs {everyone[peer, i]}", field,
                            (self.rank, peer))

    def _run(self, schedule, *args):
        try:
            schedule(*args)
        except BaseException as e:
            self._broken = f"{type(e).__name__}: {e}"
            raise

    # -- argument checks ------------------------------------------------------------
    def _root(self, root):
        if not 0 <= root < self.world:
            raise ValueError(f"root must be in [0, {self.world}), got {root}")
        return root

    def _op(self, x, code):
        """The op's name, checked against x's dtype (once per pair)."""
        key = (x.dtype, code)
        name = self._ops.get(key)
        if name is None:
            name = ReduceOp.from_code(code).value
            if x.info.name not in kernels.C_TYPES:
                raise TypeError(f"unsupported dtype {x.dtype} for a reduction on the device; "
                                f"supported: {', '.join(kernels.C_TYPES)}")
            if not kernels.supports(x.info.name, name):
                raise ValueError(f"op {name!r} is not defined for dtype {x.dtype}")
            self._ops[key] = name
        return name

    def _out(self, out, shape, dtype, what="out"):
        if out is None:
            return DeviceArray(self.backend.empty(shape, dtype), what)
        o = DeviceArray(out, what)
        if o.shape != tuple(shape) or o.dtype != dtype:
            raise ValueError(f"{what} must have shape {tuple(shape)} and dtype {dtype}, "
                             f"got {o.shape} {o.dtype}")
        if o.readonly:
            raise ValueError(f"{what} must be writeable")
        return o

    def _priced(self, collective, block):
        """The size a call is decided at (shmcoll.collectives), from one rank's block."""
        return BY_NAME[collective].priced_bytes(block.nbytes, self.world)

    def _blocks(self, x):
        if not x.shape or x.shape[0] % self.world:
            raise ValueError(f"x.shape[0] must be divisible by the world size {self.world}, "
                             f"got shape {x.shape}")
        return (x.shape[0] // self.world,) + x.shape[1:]

    # -- collectives ----------------------------------------------------------------
    def allreduce(self, x, out, op, algo):
        x = DeviceArray(x, "x")
        name = self._op(x, op)
        o = self._out(out, x.shape, x.dtype)
        variant, stream = self._begin("allreduce", x, op, 0, algo, x.nbytes)
        schedule = (self.sched.one_shot if variant == "one-shot" else
                    self.sched.two_shot if variant == "two-shot" else self.sched.ring_allreduce)
        self._run(schedule, o, x, x.dtype, name, stream)
        return o.arr

    def reduce(self, x, out, op, root, algo):
        x = DeviceArray(x, "x")
        name, root = self._op(x, op), self._root(root)
        o = self._out(out, x.shape, x.dtype) if self.rank == root else None
        variant, stream = self._begin("reduce", x, op, root, algo, x.nbytes)
        self._run(self.sched.reduce_star, o, x, x.dtype, name, root, stream)
        return o.arr if o else None

    def reduce_scatter(self, x, out, op, algo):
        x = DeviceArray(x, "x")
        name = self._op(x, op)
        o = self._out(out, self._blocks(x), x.dtype)
        variant, stream = self._begin("reduce_scatter", x, op, 0, algo, x.nbytes)
        schedule = self.sched.reduce_scatter_ring if variant == "ring" else \
            self.sched.reduce_scatter_direct
        self._run(schedule, o, x, x.dtype, name, stream)
        return o.arr

    def allgather(self, x, out, algo):
        x = DeviceArray(x, "x")
        o = self._out(out, (self.world,) + x.shape, x.dtype)
        variant, stream = self._begin("allgather", x, None, 0, algo, self._priced("allgather", x))
        schedule = self.sched.allgather_ring if variant == "ring" else self.sched.allgather_direct
        self._run(schedule, o, x, x.dtype, stream)
        return o.arr

    def gather(self, x, out, root, algo):
        x = DeviceArray(x, "x")
        root = self._root(root)
        o = self._out(out, (self.world,) + x.shape, x.dtype) if self.rank == root else None
        variant, stream = self._begin("gather", x, None, root, algo, self._priced("gather", x))
        self._run(self.sched.gather_star, o, x, root, stream)
        return o.arr if o else None

    def scatter(self, x, out, root, algo):
        root = self._root(root)
        if self.rank == root or (x is not None and out is None):
            src = DeviceArray(x, "x")
            if not src.shape or src.shape[0] != self.world:
                raise ValueError(f"scatter's x must have shape (world_size={self.world}, ...), "
                                 f"got {src.shape}")
            block, dtype = src.shape[1:], src.dtype
        else:
            o = DeviceArray(out, "out")
            src, block, dtype = None, o.shape, o.dtype
        o = self._out(out, block, dtype)
        # every rank describes the root's x
        variant, stream = self._begin("scatter", o, None, root, algo, self._priced("scatter", o),
                                      count=o.count * self.world)
        self._run(self.sched.scatter_star, o, src.ptr if self.rank == root else 0, root, stream)
        return o.arr

    def broadcast(self, x, root, algo):
        arr = x
        x = DeviceArray(x, "x")
        root = self._root(root)
        if x.readonly:
            raise ValueError("x must be writeable (broadcast is in place)")
        variant, stream = self._begin("broadcast", x, None, root, algo, x.nbytes)
        schedule = self.sched.broadcast_chain if variant == "chain" else self.sched.broadcast_star
        self._run(schedule, x, root, stream)
        return arr

    # -- lifecycle ------------------------------------------------------------------
    def work(self, result):
        """The Work of the call just enqueued (returning `result`)."""
        return DeviceWork(self.backend, self.backend.record(self.backend.stream()), result)

    def synchronize(self):
        """Wait for this rank's enqueued collectives; raise what a device wait recorded."""
        self.backend.synchronize(self.backend.stream())

    def close(self, failed=False):
        if self.sched.buffers is None:
            return
        if not failed:
            try:
                self.synchronize()
            except Exception:
                failed = True
        self.sched.buffers.close(failed=failed or bool(self._broken))
        self.sched.buffers = None
