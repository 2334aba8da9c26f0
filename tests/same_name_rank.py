"""One rank of one of two jobs started at the same moment under the same job name:
prints the allreduce of its job's value, or the error it got."""
import json
import sys
import time

import numpy as np

import shmcoll

if __name__ == "__main__":
    value, start, timeout = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))
    try:
        with shmcoll.init(timeout=timeout) as comm:
            print(json.dumps(["ok", float(comm.allreduce(np.array([value]))[0])]))
    except shmcoll.ShmcollError as e:
        print(json.dumps([type(e).__name__, str(e)]))
