"""A join-mode rank that keeps nonblocking allreduces outstanding.

    async_rank.py loop COUNT   queue allreduces of COUNT float32, four outstanding,
                               until one fails; then print how each outstanding one
                               failed and exit 3
    async_rank.py loop-receiving COUNT
                               the same with a receive from rank 2 pending throughout
                               (rank 2 never sends); print how it failed too
    async_rank.py exit COUNT   queue five allreduces; rank 0 then exits at once, without
                               waiting or closing; the others check their results
"""
import sys

import numpy as np

import shmcoll

if __name__ == "__main__":
    mode, count = sys.argv[1], int(sys.argv[2])
    comm = shmcoll.init(timeout=60)
    x = np.ones(count, np.float32)
    P = comm.world_size
    if mode == "exit":
        works = [comm.allreduce(x * i, async_op=True) for i in range(5)]
        if comm.rank == 0:
            sys.exit(0)
        ok = all(np.array_equal(w.wait(), x * i * P) for i, w in enumerate(works))
        comm.close()
        print("correct" if ok else "wrong", flush=True)
        sys.exit(0)
    message = comm.recv(np.empty(4), 2, tag=99, async_op=True) \
        if mode == "loop-receiving" else None
    works = [comm.allreduce(x, async_op=True) for _ in range(4)]
    works[0].wait()
    print("looping", flush=True)
    try:
        while True:
            works.pop(0).wait()
            works.append(comm.allreduce(x, async_op=True))
    except shmcoll.PeerLostError as e:
        errors = []
        for w in works:
            try:
                w.wait()
            except shmcoll.ShmcollError as later:
                errors.append(later)
        failed = [type(err).__name__ for err in errors]
        ranks = sorted({getattr(err, "rank", None) for err in errors} - {None})
        if message is not None:
            try:
                message.wait()
            except shmcoll.ShmcollError as lost:
                failed.append(f"{type(lost).__name__}({lost.rank})")
        print(f"lost rank {e.rank}; outstanding: {' '.join(failed)}; ranks {ranks}", flush=True)
        sys.exit(3)
