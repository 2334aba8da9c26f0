"""What the GPU path needs from a device runtime, and how one is chosen.

"cupy" is the real backend (CUDA IPC via CuPy); "host" keeps the same protocol in
host shared memory so that everything but the device itself is tested without a GPU.
Pointers are integers, as in __cuda_array_interface__.
"""
from typing import Any, Dict, Optional, Protocol, Sequence

from shmcoll._core.settings import get
from shmcoll.errors import DeviceError


class DeviceBackend(Protocol):
    """The device runtime a DevicePath drives (shmcoll.cuda.collectives)."""
    name: str

    def identity(self) -> bytes:
        """Which GPU this is (the calibration key, and what peers compare)."""

    def can_reach(self, identity: bytes) -> bool:
        """Whether this GPU's memory can reach a peer's (same GPU: always)."""

    def malloc(self, nbytes: int) -> int:
        """A dedicated allocation (never a pool's: IPC exports whole allocations)."""

    def free(self, ptr: int) -> None: ...

    def memory_bytes(self) -> int:
        """The device's total memory (0 where it has none of its own)."""

    def memset(self, ptr: int, value: int, nbytes: int) -> None: ...

    def ipc_handle(self, ptr: int) -> bytes:
        """64 bytes that let a peer process open the allocation."""

    def ipc_open(self, handle: bytes) -> int:
        """A peer's allocation mapped here (peer access enabled lazily)."""

    def ipc_close(self, ptr: int) -> None: ...

    def seal(self, ptr: int) -> None:
        """Every peer has opened the allocation (its name may go)."""

    def make_table(self, ptrs: Sequence[int]) -> Any:
        """A device array of pointers, for kernels that read every peer's buffer."""

    def stream(self) -> Any:
        """Where work is enqueued: the caller's current stream."""

    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """Device-to-device copy, peers' memory included."""

    def copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
               stream: Any) -> None: ...

    def reduce(self, out: int, table: Any, nsrc: int, offset: int, count: int, dtype: Any,
               op: str, world: int, stream: Any) -> None:
        """out = table[0]+offset (+) ... (+) table[nsrc-1]+offset, in rank order."""

    def combine(self, out: int, a: int, b: int, count: int, dtype: Any, op: str,
                partial_is_acc: bool, last: bool, world: int, stream: Any) -> None:
        """One ring step: out = a (+) b (a in the accumulator type if partial_is_acc;
        out finished and in dtype if last)."""

    def sync(self, flags: Any, me: int, world: int, kind: int, peer: int, signal_value: int,
             wait_value: int, timeout: float, stream: Any) -> None:
        """Signal, then wait on, per-pair sequence numbers (peer < 0: every peer)."""

    def check(self) -> None:
        """Raise an error a device-side wait recorded."""

    def synchronize(self, stream: Any) -> None:
        """Wait for the stream's work, then check()."""

    def record(self, stream: Any) -> Any:
        """An event at the stream's current end: its query() says whether the device
        has passed it, synchronize() waits until it has."""

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        """A device array for results."""


_LOADED: Dict[str, DeviceBackend] = {}


def load(name: Optional[str] = None) -> DeviceBackend:
    """The backend named by SHMCOLL_CUDA_BACKEND (or `name`), created once per process."""
    name = name or get("SHMCOLL_CUDA_BACKEND")
    if name not in _LOADED:
        if name == "cupy":
            from shmcoll.cuda.cupy_backend import CupyBackend
            _LOADED[name] = CupyBackend()
        elif name == "host":
            from shmcoll.cuda.host import HostBackend
            _LOADED[name] = HostBackend()
        else:
            raise DeviceError(f"SHMCOLL_CUDA_BACKEND={name!r}: expected 'cupy' or 'host'")
    return _LOADED[name]
