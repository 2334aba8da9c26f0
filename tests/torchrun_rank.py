"""A script torchrun starts: joins the "shmcoll" backend from torchrun's environment
(env://) and prints one line per rank."""
import torch
import torch.distributed as dist

import shmcoll.torch  # noqa: F401 - registers the backend

dist.init_process_group("shmcoll")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print(f"rank {rank} of {world}: {dist.get_backend()} sum {t.tolist()}", flush=True)
dist.destroy_process_group()
