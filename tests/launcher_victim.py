"""A launcher whose ranks loop allreduces until the launcher is signalled."""
import os

import numpy as np

import shmcoll


def work(comm):
    os.write(1, f"rank {comm.rank} pid {os.getpid()}\n".encode())   # one write: lines stay whole
    x = np.ones(1 << 16, np.float32)
    while True:
        comm.allreduce(x)


if __name__ == "__main__":
    shmcoll.launch(work, 2)
