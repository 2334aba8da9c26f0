"""A program `shmcoll run` starts in the tests (as a script or with -m): it reports
what its rank was given, then does what its arguments say.

    run_target.py env                  print the rank's launch variables
    run_target.py allreduce            join with shmcoll.init() and allreduce
    run_target.py fail RANK CODE       rank RANK exits with CODE, the others wait
    run_target.py kill RANK SIGNAL     rank RANK kills itself with SIGNAL
    run_target.py sleep                print "ready" and sleep (to be interrupted)
    run_target.py threads              count this process's threads after a BLAS call
"""
import json
import os
import signal
import sys
import time

# Longer than any test waits: a rank still sleeping when its test ends was not stopped.
LONG = 600

VARIABLES = ("SHMCOLL_RANK", "SHMCOLL_WORLD_SIZE", "SHMCOLL_JOB", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def say(text):
    """One line in one write: ranks share the pipe, and a write of a line is atomic."""
    os.write(1, (text + "\n").encode())


def main(what, *args):
    rank = int(os.environ["SHMCOLL_RANK"])
    if what == "env":
        say(json.dumps({v: os.environ.get(v) for v in VARIABLES}))
    elif what == "allreduce":
        import numpy as np
        import shmcoll
        with shmcoll.init() as comm:
            total = comm.allreduce(np.array([comm.rank + 1.0]))
            say(f"rank {comm.rank} of {comm.world_size}: {total[0]}")
    elif what == "fail":
        if rank == int(args[0]):
            time.sleep(0.2)
            sys.exit(int(args[1]))
        time.sleep(LONG)
    elif what == "kill":
        if rank == int(args[0]):
            time.sleep(0.2)
            os.kill(os.getpid(), getattr(signal, args[1]))
        time.sleep(LONG)
    elif what == "sleep":
        say(f"ready {rank}")
        time.sleep(LONG)
    elif what == "threads":
        import numpy as np
        a = np.ones((400, 400))
        for _ in range(3):
            a @ a
        say(json.dumps({"threads": len(os.listdir("/proc/self/task"))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
