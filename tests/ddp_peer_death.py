"""A rank of a two-rank DDP job on the shmcoll backend: rank 1 dies in the middle of
training; rank 0 must get an error naming it (not hang, not crash) and reports it.

    python ddp_peer_death.py STORE_PATH RANK
"""
import os
import sys

import torch
import torch.distributed as dist

import shmcoll.torch  # noqa: F401 - registers the backend

store_path, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("shmcoll", store=dist.FileStore(store_path, 2), rank=rank,
                        world_size=2)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
try:
    for step in range(1000):
        if rank == 1 and step == 3:
            os._exit(7)
        model(torch.randn(4, 256)).sum().backward()
    os.write(1, b"no error\n")
except RuntimeError as e:
    os.write(1, f"error at step {step}: {e}\n".encode())
