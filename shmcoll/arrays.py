"""What collectives accept besides numpy arrays, judged by what an object is.

A class may declare an interface its instances do not have: ``torch.Tensor`` defines
``__cuda_array_interface__`` for every tensor, and a CPU tensor raises when asked for
it.  So an object is on the device when its DLPack device says so, or, without
DLPack, when reading its CUDA array interface works; everything else is host memory
and reaches the CPU engine as a numpy view of the same memory (no copy):

  * torch tensors through their ``numpy()`` view; bfloat16, which numpy lacks, as its
    bits (int16) viewed as ml_dtypes.bfloat16; a tensor that requires grad through
    ``detach()`` (same memory), one with the conjugate bit through its resolved copy;
  * other DLPack producers (JAX CPU arrays…) through ``np.from_dlpack``;
  * the buffer protocol (memoryview, bytearray, array.array) and
    ``__array_interface__`` through ``np.asarray``.

Results come back in the caller's kind: the caller's own ``out`` (or broadcast's x)
when it passed one, a tensor sharing the result's memory for torch inputs, else the
numpy array.  Nothing here imports torch: a tensor's own module is used.
"""
import sys

import numpy as np

_NDARRAY = np.ndarray
_CAI = "__cuda_array_interface__"
# DLPack device types whose memory a CPU cannot address directly.
_DEVICE_TYPES = {2, 10, 13}     # CUDA, ROCm, CUDA managed


def _dlpack_device_type(x):
    """x's DLPack device type, or None when it has none (or cannot say)."""
    if getattr(type(x), "__dlpack_device__", None) is None:
        return None
    try:
        return int(x.__dlpack_device__()[0])
    except Exception:  # noqa: BLE001 - an object that cannot say is judged otherwise
        return None


def is_device_array(x):
    """True for arrays in GPU memory: a DLPack device of a GPU, or (without DLPack) a
    CUDA array interface that can actually be read."""
    if type(x) is _NDARRAY or x is None:
        return False
    torch = _torch_of(x)
    if torch is not None:           # (asking a tensor costs less than asking DLPack)
        return x.is_cuda
    kind = _dlpack_device_type(x)
    if kind is not None:
        return kind in _DEVICE_TYPES
    if not (hasattr(type(x), _CAI) or _CAI in getattr(x, "__dict__", ())):
        return False
    try:
        getattr(x, _CAI)
    except Exception:  # noqa: BLE001 - declared but not there: host memory
        return False
    return True


def _torch_of(x):
    """The torch module when x is a torch tensor (torch is imported if it is one)."""
    module = type(x).__module__
    if module.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            return torch
    return None


def _bfloat16():
    """ml_dtypes.bfloat16, which numpy needs to hold torch's bfloat16."""
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("bfloat16 tensors need ml_dtypes: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def _tensor_as_numpy(torch, t):
    if t.requires_grad:
        t = t.detach()              # the same memory, without the autograd record
    if t.is_conj():
        t = t.resolve_conj()        # (a copy: the conjugate bit is not memory)
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bfloat16())
    return t.numpy()                # the same memory; faster than np.from_dlpack


def as_numpy(x, what="x"):
    """x as a numpy array over the same memory (copied only when it must be: lists,
    scalars, conjugated tensors)."""
    if isinstance(x, _NDARRAY):     # (subclasses too: the engine takes them)
        return x
    torch = _torch_of(x)
    if torch is not None:
        return _tensor_as_numpy(torch, x)
    if _dlpack_device_type(x) is not None and hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as e:
            raise TypeError(f"{what} ({type(x).__name__}) cannot be read through DLPack: "
                            f"{e}") from None
    if not hasattr(x, "__array_interface__"):
        try:
            view = memoryview(x)    # (bytes would otherwise become one bytes scalar)
        except TypeError:
            return np.asarray(x)    # a list, a scalar: copied, as inputs may be
        return np.asarray(view)
    return np.asarray(x)


def _is_memory(x):
    """Whether x is memory of its own (not a list or a scalar, which would be copied)."""
    if isinstance(x, _NDARRAY) or hasattr(x, "__dlpack__") or \
            hasattr(x, "__array_interface__"):
        return True
    try:
        memoryview(x).release()
    except TypeError:
        return False
    return True


def as_out(out, what="out"):
    """A buffer a collective writes into: the caller's own memory or an error (a
    read-only or unaddressable buffer is refused, never replaced by a copy)."""
    if out is None or type(out) is _NDARRAY:
        return out
    if not _is_memory(out):
        raise TypeError(f"{what} must be memory the result is written into (a numpy.ndarray, "
                        f"a tensor, an object with __dlpack__ or __array_interface__, or a "
                        f"writable buffer), got {type(out).__name__}")
    torch = _torch_of(out)
    if torch is not None and (out.is_conj() or out.is_neg()):
        raise ValueError(f"{what} has torch's conjugate or negative bit set; its memory "
                         f"does not hold the values (call resolve_conj() first)")
    arr = as_numpy(out, what)
    if not arr.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return arr


def result_like(result, x, xa, out, oa):
    """The result in the caller's kind (see the module's doc); xa and oa are the numpy
    views the engine was given for x and out."""
    if result is None:
        return None
    if out is not None and result is oa:
        return out
    if x is not None and result is xa:
        return x
    torch = _torch_of(x) if x is not None else None
    if torch is not None and type(result) is _NDARRAY:
        if result.dtype.kind == "V" and result.dtype == _bfloat16_or_none():
            return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(result)
    return result


def in_kind_of(got, async_op, x, xa, out, oa):
    """What the engine returned (a result, or a Work) with the result in the caller's
    kind."""
    if not async_op:
        return result_like(got, x, xa, out, oa)
    from shmcoll.work import ConvertedWork
    return ConvertedWork(got, lambda result: result_like(result, x, xa, out, oa))


def _bfloat16_or_none():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)
