import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# Algorithm choices must not depend on a calibration this machine happens to have.
os.environ["SHMCOLL_CALIBRATION"] = "off"

from shmcoll._core import segment  # noqa: E402
from rankpool import RankPool  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--soak-full", action="store_true",
                     help="run the soak at full size: 10,000 collectives, 10^6 ring messages")
    parser.addoption("--full", action="store_true",
                     help="run every case of the matrices; without it, beyond four ranks "
                          "the matrix runs a fixed half of its cases and alltoall skips "
                          "P = 6, 7 (what a plain `pytest`, and so CI, runs)")


@pytest.fixture
def soak_full(request):
    return request.config.getoption("--soak-full")


@pytest.fixture
def full(request):
    return request.config.getoption("--full")


@pytest.fixture(scope="session", autouse=True)
def no_shm_leaks():
    """No /dev/shm entry of the project may survive the test session."""
    before = set(segment.list_entries())
    yield
    leaked = set(segment.list_entries()) - before
    assert not leaked, f"leaked shared-memory entries: {sorted(leaked)}"


_pools = {}


@pytest.fixture(scope="session")
def pools():
    """pools(P) -> a RankPool of P live ranks, started once per session."""
    def get(world):
        if world not in _pools:
            _pools[world] = RankPool(world)
        return _pools[world]
    yield get
    for pool in _pools.values():
        pool.close()
    _pools.clear()
