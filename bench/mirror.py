"""A non-zero rank of the benchmark job: repeats every collective rank 0 benchmarks.

Started by bench/conftest.py with SHMCOLL_JOB/RANK/WORLD_SIZE set; rank 0 is the
pytest process itself, so pytest-benchmark times the real call end to end.
"""
import json

import numpy as np

import shmcoll
from shmcoll.perf import Case

COMMAND_BYTES = 512


def exchange_command(comm, command=None):
    """Rank 0's command reaches every rank through an allgather of fixed size."""
    buf = np.zeros(COMMAND_BYTES, np.uint8)
    if command is not None:
        raw = json.dumps(command).encode()
        buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    row = comm.allgather(buf)[0]
    return json.loads(row.tobytes().rstrip(b"\0").decode())


def build(comm, cmd):
    case = Case(comm, cmd["collective"], cmd["nbytes"], cmd["dtype"], cmd["op"], cmd["algo"])
    return case, case.call(cmd["inplace"])


def serve(comm):
    while True:
        cmd = exchange_command(comm)
        if cmd["collective"] == "stop":
            return
        _, call = build(comm, cmd)
        for _ in range(cmd["calls"]):
            call()


if __name__ == "__main__":
    with shmcoll.init() as comm:
        serve(comm)
