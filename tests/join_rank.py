"""A rank started by someone else (a shell loop, mpirun): joins by job name."""
import json
import sys

import numpy as np

import shmcoll

if __name__ == "__main__":
    with shmcoll.init(timeout=float(sys.argv[1]) if len(sys.argv) > 1 else None) as comm:
        x = np.arange(6, dtype=np.int32) * (comm.rank + 1)
        y = comm.allreduce(x)
        g = comm.allgather(np.array([comm.rank], np.int64))
        comm.barrier()
        print(json.dumps({"rank": comm.rank, "world": comm.world_size,
                          "sum": y.tolist(), "gathered": g[:, 0].tolist()}))
