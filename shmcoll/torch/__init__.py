"""shmcoll as a torch.distributed backend (the optional extra ``shmcoll[torch]``).

    import torch.distributed as dist
    import shmcoll.torch                      # registers the backend "shmcoll"

    dist.init_process_group("shmcoll")        # env://, tcp://, file:// or a store
    dist.all_reduce(tensor)                   # CPU tensors move over shared memory

The group's ranks must run on one machine: they find each other's shared segment
through torch's store (no other rendezvous), and a group spanning hosts is refused
when it is created.  ``"cpu:shmcoll,cuda:nccl"`` sends CPU tensors through shmcoll
and CUDA tensors to the backend named for them, created on the first CUDA tensor.

What a group implements, and how each torch call maps onto shmcoll's collectives:
shmcoll.torch.process_group.  ``shmcoll.torch.empty(shape, dtype)`` gives a CPU
tensor in the group's symmetric memory: collectives on it read peers' tensors in place
(shmcoll.torch.symmetric).  Importing this module imports torch; ``import shmcoll``
never does.
"""
from shmcoll.torch.process_group import BACKEND, ProcessGroupShmcoll, register
from shmcoll.torch.symmetric import empty, zeros

register()

__all__ = ["BACKEND", "ProcessGroupShmcoll", "register", "empty", "zeros"]
