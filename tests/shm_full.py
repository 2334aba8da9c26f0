"""Runs inside a private mount namespace whose /dev/shm is a tiny tmpfs (see
test_shm_full.py): a job that does not fit must raise, never die of SIGBUS, and leave
nothing behind.  Prints one JSON object."""
import json
import os
import sys

import numpy as np

import shmcoll


def allreduce_outcome(comm, algo):
    try:
        y = comm.allreduce(np.ones(1 << 16, np.float32), algo=algo)
        return "ok", float(y[0])
    except shmcoll.ShmcollError as e:
        return type(e).__name__, str(e)


def symmetric_outcome(comm):
    """A symmetric allocation that does not fit: every rank raises, the communicator
    goes on, a smaller one fits."""
    try:
        comm.empty(1 << 20, np.float32)
        first = ("ok", "")
    except shmcoll.ShmcollError as e:
        first = (type(e).__name__, str(e))
    x = comm.empty(1000, np.float32)
    x[:] = comm.rank + 1
    return first, float(comm.allreduce(x, out=x, algo="symmetric")[0])


def symmetric_main(world):
    result = {"outcomes": shmcoll.launch(symmetric_outcome, world, timeout=30),
              "left": os.listdir("/dev/shm")}
    print(json.dumps(result))


def main(world, algo):
    try:
        result = {"outcomes": shmcoll.launch(allreduce_outcome, world, args=(algo,), timeout=30)}
    except shmcoll.LaunchError as e:
        result = {"error": "LaunchError", "failures": {str(k): v for k, v in e.failures.items()}}
    except shmcoll.ShmcollError as e:
        result = {"error": type(e).__name__, "message": str(e)}
    result["left"] = os.listdir("/dev/shm")
    print(json.dumps(result))


def join_after_space_ran_out():
    """Rank 0 joins (its ring channel fits), then a file takes the space left, then
    rank 1 joins: its channel cannot be backed, and both ranks must be refused."""
    import threading
    import time
    outcomes = {}

    def rank(r):
        try:
            with shmcoll.init(rank=r, world_size=2, job="full", timeout=30):
                outcomes[r] = ("ok", "")
        except shmcoll.ShmcollError as e:
            outcomes[r] = (type(e).__name__, str(e))
    first = threading.Thread(target=rank, args=(0,))
    first.start()
    while not [n for n in os.listdir("/dev/shm") if n.startswith("shmcoll.")]:
        time.sleep(0.005)
    time.sleep(0.2)                      # rank 0 has reserved its ring channel
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    with open("/dev/shm/filler", "wb") as f:
        f.write(b"\0" * (free - 64 * 1024))
    second = threading.Thread(target=rank, args=(1,))
    second.start()
    first.join()
    second.join()
    os.unlink("/dev/shm/filler")
    print(json.dumps({"outcomes": [outcomes[0], outcomes[1]], "left": os.listdir("/dev/shm")}))


if __name__ == "__main__":
    if sys.argv[1] == "join":
        join_after_space_ran_out()
    elif sys.argv[2] == "symmetric":
        symmetric_main(int(sys.argv[1]))
    else:
        main(int(sys.argv[1]), None if sys.argv[2] == "auto" else sys.argv[2])
