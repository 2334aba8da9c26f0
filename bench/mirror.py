"""A non-zero rank of the benchmark job: repeats every collective rank 0 benchmarks.

Started by bench/conftest.py with SHMCOLL_JOB/RANK/WORLD_SIZE set; rank 0 is the
pytest process itself, so pytest-benchmark times the real call end to end.  The
protocol (a command allgathered from rank 0, then `calls` calls) is shared with
`shmcoll bench-ab`.
"""
import shmcoll
from shmcoll.abtest import build, exchange_command, mirror, pin  # noqa: F401 (conftest imports)

if __name__ == "__main__":
    with shmcoll.init() as comm:
        pin(comm.rank)
        mirror(comm)
