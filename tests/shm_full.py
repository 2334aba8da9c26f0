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


def main(world, algo):
    try:
        result = {"outcomes": shmcoll.launch(allreduce_outcome, world, args=(algo,), timeout=30)}
    except shmcoll.LaunchError as e:
        result = {"error": "LaunchError", "failures": {str(k): v for k, v in e.failures.items()}}
    except shmcoll.ShmcollError as e:
        result = {"error": type(e).__name__, "message": str(e)}
    result["left"] = os.listdir("/dev/shm")
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), None if sys.argv[2] == "auto" else sys.argv[2])
