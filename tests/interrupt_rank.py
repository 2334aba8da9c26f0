"""A join-mode rank that blocks (in init or in an allreduce) until it is interrupted."""
import sys
import time

import numpy as np

import shmcoll

if __name__ == "__main__":
    where = sys.argv[1]
    if where == "init":
        shmcoll.init(timeout=60)              # the other rank never comes
    else:
        comm = shmcoll.init(timeout=60)
        print("joined", flush=True)
        if comm.rank == 1:
            time.sleep(60)                    # alive, never calls
        else:
            comm.allreduce(np.ones(4, np.float32))
