"""What the GPU path needs from a device runtime, and how one is chosen.

A backend provides (pointers are integers, as in __cuda_array_interface__):

  identity() / can_reach(identity)     which GPU this is; whether its memory can reach
                                       a peer's (same GPU: always, without a check)
  malloc, free, memset                 dedicated allocations (never a pool's)
  ipc_handle(ptr) -> 64 bytes          export an allocation
  ipc_open(handle) -> ptr, ipc_close   import a peer's (lazy peer access)
  seal(ptr)                            every peer has opened it
  make_table(ptrs)                     a device array of pointers, for kernels
  stream()                             where work is enqueued: the caller's current stream
  copy, copy2d                         device-to-device copies, peers' memory included
  reduce(out, table, nsrc, offset, count, dtype, op, world, stream)
                                       out = table[0]+offset (+) ... in rank order
  combine(out, a, b, count, dtype, op, partial_is_acc, last, world, stream)
                                       one ring step: out = a (+) b
  sync(flags, me, world, kind, peer, signal_value, wait_value, timeout, stream)
                                       signal then wait on per-pair sequence numbers
  check(), synchronize(stream)         raise an error a device wait recorded
  empty(shape, dtype)                  a device array for results

"cupy" is the real one (CUDA IPC via CuPy); "host" keeps the same protocol in host
shared memory so that everything but the device itself is tested without a GPU.
"""
from shmcoll.config import get
from shmcoll.errors import DeviceError

_LOADED = {}


def load(name=None):
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
