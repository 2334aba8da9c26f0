"""pytest-benchmark suite: every collective x algorithm x size x P, between live ranks.

    pytest bench --benchmark-autosave                 # save a baseline
    pytest bench --benchmark-compare --benchmark-compare-fail=median:15%
"""
import pytest

from shmcoll.algorithms import REGISTRY

SIZES = [8, 4 << 10, 256 << 10, 16 << 20]
WORLDS = [2, 4]


def algorithms(collective):
    return [name for name, alg in REGISTRY.items() if collective in alg.COLLECTIVES]


PARAMS = [(c, a) for c in ("allreduce", "reduce_scatter", "allgather") for a in algorithms(c)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", SIZES, ids=[f"{s}B" for s in SIZES])
@pytest.mark.parametrize("collective,algo", PARAMS, ids=[f"{c}-{a}" for c, a in PARAMS])
def test_collective(run_collective, collective, algo, nbytes, world):
    run_collective(world, collective, nbytes, algo=algo)
