"""The GPU path: collectives on device arrays of ranks on one node, through CUDA IPC
buffers, with the shared-memory engine as the control plane.

Communicator methods send any array exposing ``__cuda_array_interface__`` (CuPy's,
or another library's) here and numpy arrays to the CPU engine.  Nothing here
imports CuPy until a device array arrives (``pip install 'shmcoll[cuda]'``).
"""
import numpy as np

_NDARRAY = np.ndarray


_CAI = "__cuda_array_interface__"


def is_device_array(x):
    """True for arrays in GPU memory (they expose __cuda_array_interface__).  Looked
    up on the type first: on an instance, hasattr would compute the interface."""
    return type(x) is not _NDARRAY and x is not None and (
        hasattr(type(x), _CAI) or _CAI in getattr(x, "__dict__", ()))


def array_converters():
    """(to_device, to_host) for the configured backend: CuPy's, or the host stand-in's
    (SHMCOLL_CUDA_BACKEND=host), for tools that fill and check device arrays."""
    from shmcoll._core.settings import get
    if get("SHMCOLL_CUDA_BACKEND") == "host":
        from shmcoll.cuda.host import HostArray
        return HostArray, lambda a: a.host.copy()
    try:
        import cupy
    except ImportError:
        from shmcoll.errors import DeviceError
        raise DeviceError("device arrays need CuPy: pip install 'shmcoll[cuda]'") from None
    return cupy.asarray, cupy.asnumpy
