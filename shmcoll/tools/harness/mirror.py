"""Live ranks for measurements: rank 0 (a benchmark, a `bench-ab` side) names each
call in a command that reaches every rank through a fixed-size allgather, and ranks
1..P-1, started by start_mirrors with SHMCOLL_JOB/RANK/WORLD_SIZE set, repeat it `calls`
times."""
import json
import os
import subprocess
import sys

import numpy as np

from shmcoll.tools.harness.case import Case
from shmcoll.tools.harness.timing import pin

COMMAND_BYTES = 512
# A mirror process (not `-m`: this module is already imported by its package).
_MIRROR = "from shmcoll.tools.harness.mirror import main; main()"


def exchange_command(comm, command=None):
    """Rank 0's command reaches every rank through an allgather of fixed size."""
    buf = np.zeros(COMMAND_BYTES, np.uint8)
    if command is not None:
        raw = json.dumps(command).encode()
        if len(raw) > COMMAND_BYTES:
            raise ValueError(f"command too long: {command}")
        buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    row = comm.allgather(buf, algo="ring")[0]
    return json.loads(row.tobytes().rstrip(b"\0").decode())


def build(comm, cmd):
    """The case a command names and its call."""
    case = Case(comm, cmd["collective"], cmd["nbytes"], cmd.get("dtype", "float32"),
                cmd.get("op", "sum"), cmd.get("algo"), cmd.get("root", 0),
                symmetric=cmd.get("symmetric", False))
    return case, case.call(cmd.get("inplace", False))


def mirror(comm):
    """A rank other than 0: repeat every call rank 0 makes, until told to stop."""
    while True:
        cmd = exchange_command(comm)
        if cmd["collective"] == "stop":
            return
        _, call = build(comm, cmd)
        for _ in range(cmd["calls"]):
            call()


def start_mirrors(world, job, python=sys.executable, env=None, cwd=None):
    """Processes for ranks 1..world-1 of `job`, started in `cwd` (`-c` puts it first on
    sys.path: run from a source checkout, they would import its unbuilt package)."""
    base = dict(os.environ if env is None else env, SHMCOLL_JOB=job,
                SHMCOLL_WORLD_SIZE=str(world))
    return [subprocess.Popen([python, "-c", _MIRROR],
                             env=dict(base, SHMCOLL_RANK=str(r)), cwd=cwd)
            for r in range(1, world)]


def main():
    import shmcoll
    with shmcoll.init() as comm:
        pin(comm.rank)
        mirror(comm)
