"""A join-mode rank that loops allreduce of COUNT float32 until something fails."""
import sys
import time

import numpy as np

import shmcoll

if __name__ == "__main__":
    count = int(sys.argv[1])
    comm = shmcoll.init(timeout=60)
    x = np.ones(count, np.float32)
    out = np.empty_like(x)
    comm.allreduce(x, out=out)
    print("looping", flush=True)
    try:
        while True:
            comm.allreduce(x, out=out)
    except shmcoll.PeerLostError as e:
        print(f"lost rank {e.rank} at {time.monotonic():.3f}: {e}", flush=True)
        sys.exit(3)
