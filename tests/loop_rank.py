"""A join-mode rank that loops allreduce of COUNT float32 until something fails
(`symmetric`: in place on a symmetric allocation, the single-copy path; `cma`: in
place on an ordinary array that peers read with cross-memory attach; `direct`: the
direct schedules, whose chunks every peer reads where their sender wrote them once)."""
import sys
import time

import numpy as np

import shmcoll

if __name__ == "__main__":
    count = int(sys.argv[1])
    comm = shmcoll.init(timeout=60)
    if sys.argv[2:] == ["symmetric"]:
        x = comm.empty(count, np.float32)
        x[:] = 0
        out = x
    else:
        x = np.ones(count, np.float32)
        out = np.empty_like(x)
    algo = sys.argv[2] if sys.argv[2:] in (["cma"], ["direct"]) else None
    if algo == "cma":
        out = x
        if comm.cross_memory is None:
            print("unavailable", flush=True)     # the ranks may not read each other here
            sys.exit(0)
    comm.allreduce(x, out=out, algo=algo)
    print("looping", flush=True)
    try:
        while True:
            comm.allreduce(x, out=out, algo=algo)
    except shmcoll.PeerLostError as e:
        print(f"lost rank {e.rank} at {time.monotonic():.3f}: {e}", flush=True)
        sys.exit(3)
