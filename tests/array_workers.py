"""Rank functions of test_arrays: collectives on torch tensors and other non-numpy
arrays (module level, so spawned ranks import them)."""
import numpy as np

from reference import BFLOAT16
from shmcoll.tools.harness import in_place, invoke
from workers import _case_inputs


def to_torch(a):
    """A tensor over the same memory as numpy array a (bfloat16 through its bits)."""
    import torch
    if a is None:
        return None
    if BFLOAT16 is not None and a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def run_torch_cases(comm, cases, with_out=False, async_op=False):
    """Each case of reference.expected_result on torch tensors made over the case's
    numpy inputs; with_out: into a tensor `out` (whose identity must come back).
    Returns, per case, (result as numpy, whether it was a tensor, whether it was the
    caller's own out or x where it should be)."""
    import torch
    results = []
    for collective, shape, dt, op, inplace, algo, seed, root in cases:
        x, out = _case_inputs(comm, collective, shape, dt, op, seed, root)
        if inplace:
            if collective in ("allgather", "gather"):
                out = np.empty((comm.world_size,) + tuple(shape), x.dtype)
            x, out = in_place(comm, collective, x, out, root)
        elif with_out and collective not in ("broadcast", "scatter"):
            like = invoke(comm, collective, x, None, op, root, algo)    # its shape
            out = None if like is None else np.empty_like(like)
        tx, tout = to_torch(x), to_torch(out)
        got = invoke(comm, collective, tx, tout, op, root, algo, async_op=async_op)
        if async_op:
            got = got.wait()
        own = tout if tout is not None else tx if collective == "broadcast" else None
        results.append((None if got is None else to_numpy(got).copy(),
                        got is None or isinstance(got, torch.Tensor),
                        own is None or got is None or got is own))
    return results


class DLPackOnly:
    """An array that only speaks DLPack (as a JAX CPU array does), over numpy memory."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class ArrayInterfaceOnly:
    def __init__(self, arr):
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


def other_kinds(comm):
    """Collectives on a DLPack-only array, an __array_interface__ object, array.array,
    memoryview out and bytearray out; each result and whether memory was shared."""
    import array
    r, P = comm.rank, comm.world_size
    base = np.full(4, r + 1, np.float32)
    dl = comm.allreduce(DLPackOnly(base))
    ai = comm.allreduce(ArrayInterfaceOnly(base))
    arr = array.array("i", [r, 2 * r])
    aa = comm.allreduce(arr)
    store = np.zeros(4, np.float32)
    mv = comm.allreduce(base, out=memoryview(store))
    raw = bytearray(P)
    rows = memoryview(raw).cast("B", (P, 1))
    ba = comm.allgather(np.array([r], np.uint8), out=rows)
    buf = bytearray(b"\x00\x01\x02") if r == 0 else bytearray(3)
    bc = comm.broadcast(buf)
    inplace_dl = DLPackOnly(base.copy())
    comm.allreduce(inplace_dl, out=inplace_dl)
    return (dl.tolist(), ai.tolist(), aa.tolist(), (mv.obj is store, store.tolist()),
            (ba is rows, list(raw)), (bc is buf, list(buf)), inplace_dl._arr.tolist())


def refusals(comm):
    """What bad non-numpy arguments raise (the same on every rank, so nothing runs)."""
    import torch
    from workers import _outcome
    calls = {
        "read-only out": lambda: comm.allreduce(np.ones(3), out=memoryview(bytes(24)).cast("d")),
        "bool sum": lambda: comm.allreduce(torch.ones(3, dtype=torch.bool)),
        "complex prod": lambda: comm.allreduce(np.ones(3, np.complex64), op="prod"),
        "complex max": lambda: comm.allreduce(torch.ones(2, dtype=torch.complex128), op="max"),
        "conj out": lambda: comm.allreduce(torch.ones(2, dtype=torch.complex64),
                                           out=torch.ones(2, dtype=torch.complex64).conj()),
        "non-contiguous out": lambda: comm.allreduce(torch.ones(4), out=torch.ones(8)[::2]),
        "wrong out dtype": lambda: comm.allreduce(torch.ones(4), out=torch.ones(4, dtype=torch.int32)),
    }
    got = {name: _outcome(call)[:3:2] for name, call in calls.items()}
    got["after"] = comm.allreduce(torch.ones(2)).tolist()
    return got


def grad_and_strided(comm):
    """A tensor that requires grad and a transposed (non-contiguous) one."""
    import torch
    g = torch.ones(3, requires_grad=True)
    y = comm.allreduce(g)
    comm.allreduce(g, out=g)        # in place, outside autograd (as torch.distributed)
    t = torch.arange(6.).reshape(2, 3).t()
    return y.tolist(), g.detach().tolist(), comm.allreduce(t).tolist()
