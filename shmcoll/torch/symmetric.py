"""CPU tensors in symmetric memory of a shmcoll group (Communicator.empty for torch).

    t = shmcoll.torch.empty(1 << 20)          # collective over the group
    t.copy_(grad); dist.all_reduce(t)         # peers read t where it lies: one copy

The tensor is a view of this rank's array in a symmetric allocation of the group's
communicator, so every collective the group runs on it (or on a view of it at the
same place on every rank) may take the single-copy schedules (shmcoll.symmetric).
"""
import math

import numpy as np


def _backend(group):
    import torch
    import torch.distributed as dist
    from shmcoll.torch.process_group import ProcessGroupShmcoll
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("shmcoll.torch.empty needs an initialised process group")
    backend = pg
    if not isinstance(pg, ProcessGroupShmcoll):     # a group wrapping per-device backends
        try:
            backend = pg._get_backend(torch.device("cpu"))
        except RuntimeError:
            pass
    if not isinstance(backend, ProcessGroupShmcoll):
        raise ValueError(f"the group's CPU backend is {type(backend).__name__}, not shmcoll: "
                         f"symmetric tensors live in a shmcoll group's shared memory")
    return backend


def empty(shape, dtype=None, group=None):
    """A new CPU tensor of `shape` and `dtype` (torch's default dtype if None) in
    symmetric memory of `group` (default: the default group), which must run on the
    shmcoll backend.  Collective: every rank of the group calls it with the same shape
    and dtype.  Its contents are zero (a new segment's pages)."""
    import torch
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    dtype = dtype or torch.get_default_dtype()
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = _backend(group).comm.empty(math.prod(shape) * itemsize, np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)


zeros = empty
