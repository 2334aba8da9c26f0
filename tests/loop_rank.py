"""A join-mode rank that loops allreduce of COUNT float32 until something fails
(`symmetric`: in place on a symmetric allocation, the single-copy path; `cma`: in
place on an ordinary array that peers read with cross-memory attach; `direct`: the
direct schedules, whose chunks every peer reads where their sender wrote them once;
`broadcast:R`: a Broadcast from rank R, which under direct (the star) writes each chunk
once for every peer to copy; `allgather`: an AllGather; these two take an algorithm
after them, cma included, whose copies are pushed into the receivers' memory)."""
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
    if sys.argv[2:3] and sys.argv[2].startswith("broadcast:"):
        root = int(sys.argv[2].split(":")[1])
        algo = sys.argv[3] if sys.argv[3:] else None

        def call():
            comm.broadcast(x, root=root, algo=algo)
    elif sys.argv[2:3] == ["allgather"]:
        algo = sys.argv[3] if sys.argv[3:] else None
        rows = np.empty((comm.world_size, count), np.float32)

        def call():
            comm.allgather(x, out=rows, algo=algo)
    else:
        def call():
            comm.allreduce(x, out=out, algo=algo)
    if algo == "cma" and comm.cross_memory is None:
        print("unavailable", flush=True)     # the ranks may not reach each other here
        sys.exit(0)
    call()
    print("looping", flush=True)
    try:
        while True:
            call()
    except shmcoll.PeerLostError as e:
        print(f"lost rank {e.rank} at {time.monotonic():.3f}: {e}", flush=True)
        sys.exit(3)
