"""The GPU path: collectives on device arrays of ranks on one node, through CUDA IPC
buffers, with the shared-memory engine as the control plane.

Communicator methods send any array exposing ``__cuda_array_interface__`` (CuPy's,
or another library's) here and numpy arrays to the CPU engine.  Nothing here
imports CuPy until a device array arrives (``pip install 'shmcoll[cuda]'``).
"""
import numpy as np

_NDARRAY = np.ndarray


def is_device_array(x):
    """True for arrays in GPU memory (they expose __cuda_array_interface__)."""
    return type(x) is not _NDARRAY and x is not None and hasattr(x, "__cuda_array_interface__")
