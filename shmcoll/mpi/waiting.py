"""Waiting for MPI the way the engine waits for a peer: spin briefly, then yield,
then sleep, always with a deadline.

MPI libraries busy-poll inside a blocking call: where ranks outnumber cores (or the
node phases of other ranks need the core) a rank waiting for the network holds the
core its peers need.  The compositions therefore start each MPI phase as a
nonblocking call and complete it here: MPI_Test (which also advances MPI's progress)
while spinning for SHMCOLL_SPIN_US, between sched_yield() calls for SHMCOLL_YIELD_US
(at least MIN_YIELD_S), then between sleeps growing to MAX_SLEEP.  A phase still
unfinished after the
communicator's timeout raises shmcoll.TimeoutError (the MPI request stays pending:
like the engine's, the communicator cannot be used again).  Waiting this way rather
than in a blocking MPI call costs a little latency where a core is free (the MPI
library's own spin answers sooner) and is what gives every MPI phase a deadline and
lets a failure notice from another node (mpi.faults) end the wait.
"""
import os
import time

from shmcoll.errors import TimeoutError

FIRST_SLEEP = 20e-6
MAX_SLEEP = 1e-3
# MPI advances a nonblocking collective only inside MPI calls: a sleeping rank stalls
# its peers' steps too.  So the yielding phase (which still hands the core to any
# runnable process) lasts at least this long before sleeps begin.
MIN_YIELD_S = 0.05


def complete(request, params, what, faults):
    """Return once `request` (an mpi4py Request) completed; see the module's docstring.
    A failure notice from another rank (mpi.faults) raises PeerLostError meanwhile."""
    if request.Test():
        return
    start = time.perf_counter()
    spin_end = start + params.spin_us * 1e-6
    yield_end = spin_end + max(params.yield_us * 1e-6, MIN_YIELD_S)
    deadline = start + params.timeout
    nap = FIRST_SLEEP
    while not request.Test():
        faults.check()
        now = time.perf_counter()
        if now < spin_end:
            continue
        if now >= deadline:
            raise TimeoutError(f"{what}: MPI phase unfinished after {params.timeout:g} s "
                               f"(a rank of another node never reached it)")
        if now < yield_end:
            os.sched_yield()
        else:
            time.sleep(nap)
            nap = min(nap * 2, MAX_SLEEP)
