"""The GPU path: collectives on device arrays of ranks on one node, through CUDA IPC
buffers, with the shared-memory engine as the control plane.

Communicator methods send arrays in GPU memory here (CuPy's, CUDA tensors, anything
whose DLPack device is a GPU or whose ``__cuda_array_interface__`` can be read; see
shmcoll.arrays) and host memory to the CPU engine.  Nothing here
imports CuPy until a device array arrives (``pip install 'shmcoll[cuda]'``).
"""
from shmcoll.arrays import is_device_array

__all__ = ["is_device_array", "array_converters"]


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
