"""A launcher whose ranks loop allreduces until the launcher is signalled."""
import os

import numpy as np

import shmcoll


def work(comm):
    print(f"rank {comm.rank} pid {os.getpid()}", flush=True)
    x = np.ones(1 << 16, np.float32)
    while True:
        comm.allreduce(x)


if __name__ == "__main__":
    shmcoll.launch(work, 2)
