"""pytest-benchmark suite: every collective x algorithm (and the automatic choice)
x size x P, the same on symmetric buffers (Communicator.empty: the single-copy
schedules and what auto picks there), single copy of ordinary arrays by cross-memory
attach (where the ranks may read each other's memory), and point-to-point (sendrecv,
nccl-tests' ring shift), between live ranks.  Each benchmark also records, in extra_info, the
median time divided by a memcpy of the same bytes measured in the same run
("ratio"), which `shmcoll bench-compare` compares between runs.

    pytest bench --benchmark-autosave                 # save a baseline
    pytest bench --benchmark-compare --benchmark-compare-fail=median:15%
    shmcoll bench-compare --threshold 15              # the last two saved runs, normalised
"""
import pytest

from shmcoll.tuning.algorithms import CROSS_MEMORY, SINGLE_COPY
from shmcoll.tuning.selector import ALL_COLLECTIVES, algorithms_for

SIZES = [8, 4 << 10, 256 << 10, 16 << 20]
WORLDS = [2, 4]


def algorithms(collective):
    """Every algorithm implementing the collective, and "auto" (the selector's choice)."""
    return algorithms_for(collective) + ["auto"]


PARAMS = [(c, a) for c in ALL_COLLECTIVES for a in algorithms(c)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", SIZES, ids=[f"{s}B" for s in SIZES])
@pytest.mark.parametrize("collective,algo", PARAMS, ids=[f"{c}-{a}" for c, a in PARAMS])
def test_collective(run_collective, collective, algo, nbytes, world):
    run_collective(world, collective, nbytes, algo=algo)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", SIZES, ids=[f"{s}B" for s in SIZES])
def test_sendrecv(run_collective, nbytes, world):
    run_collective(world, "sendrecv", nbytes)


SYMMETRIC = [(c, a) for c in ALL_COLLECTIVES for name in SINGLE_COPY
             if c in SINGLE_COPY[name].COLLECTIVES for a in (name, "auto")]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", SIZES, ids=[f"{s}B" for s in SIZES])
@pytest.mark.parametrize("collective,algo", SYMMETRIC, ids=[f"{c}-{a}" for c, a in SYMMETRIC])
def test_symmetric_buffers(run_collective, collective, algo, nbytes, world):
    run_collective(world, collective, nbytes, algo=None if algo == "auto" else algo,
                   inplace=collective == "allreduce", symmetric=True)


CMA = [c for c in ALL_COLLECTIVES for alg in CROSS_MEMORY.values() if c in alg.COLLECTIVES]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", SIZES, ids=[f"{s}B" for s in SIZES])
@pytest.mark.parametrize("collective", CMA)
def test_cross_memory_attach(ranks, run_collective, collective, nbytes, world):
    if ranks(world).comm.cross_memory is None:
        pytest.skip("the ranks may not read each other's memory here (SHMCOLL_CMA, ptrace)")
    run_collective(world, collective, nbytes, algo="cma")
