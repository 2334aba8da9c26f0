"""A script torchrun starts: joins the "shmcoll" backend from torchrun's environment
(env://), allreduces, takes a DistributedDataParallel step, and prints one line per
rank (in one write: the ranks share the pipe)."""
import os

import torch
import torch.distributed as dist

import shmcoll.torch  # noqa: F401 - registers the backend

dist.init_process_group("shmcoll")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)

torch.manual_seed(rank)                 # different replicas: DDP makes them equal
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
model(torch.randn(4, 8) * (rank + 1)).sum().backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
weights = [None] * world
dist.all_gather_object(weights, [p.detach().tolist() for p in model.parameters()])
same = all(w == weights[0] for w in weights)

os.write(1, f"rank {rank} of {world}: {dist.get_backend()} sum {t.tolist()} "
            f"replicas equal {same}\n".encode())
dist.destroy_process_group()
