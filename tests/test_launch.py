"""launch(): results in rank order, failures named with traceback or signal,
nothing left running or linked afterwards."""
import multiprocessing as mp
import time

import pytest

import shmcoll
from shmcoll._core import segment
from procs import launch_timing_out_fast
from workers import allreduce_sum_of_rank, kill_self_on, raise_on, rank_and_size, sleep_then_allreduce


def test_results_come_back_in_rank_order():
    assert shmcoll.launch(rank_and_size, 3) == [(0, 3), (1, 3), (2, 3)]


def test_the_issue_example():
    assert shmcoll.launch(allreduce_sum_of_rank, nprocs=4) == [450.0] * 4


def _rank_pids():
    return {p.pid for p in mp.active_children() if p.name.startswith("shmcoll-rank")}


@pytest.fixture
def no_rank_left():
    """Ranks started by the test are all gone afterwards (pool ranks aside)."""
    before = _rank_pids()
    yield
    assert _rank_pids() <= before


def test_exception_in_a_rank_names_it_with_traceback(no_rank_left):
    t0 = time.monotonic()
    with pytest.raises(shmcoll.LaunchError) as info:
        shmcoll.launch(raise_on, 3, args=(1,))
    assert list(info.value.failures) == [1]
    text = str(info.value)
    assert "rank 1" in text and "deliberate failure on rank 1" in text and "Traceback" in text
    assert time.monotonic() - t0 < 30


def test_killed_rank_is_named_with_its_signal(no_rank_left):
    with pytest.raises(shmcoll.LaunchError) as info:
        shmcoll.launch(kill_self_on, 2, args=(0,))
    assert 0 in info.value.failures
    assert "SIGKILL" in info.value.failures[0]


def test_launch_leaves_no_segment_behind():
    before = set(segment.list_entries())
    shmcoll.launch(rank_and_size, 2)
    with pytest.raises(shmcoll.LaunchError):
        shmcoll.launch(raise_on, 2, args=(0,))
    assert set(segment.list_entries()) == before


def test_collective_timeout_raises_timeout_error_naming_the_wait():
    with pytest.raises(shmcoll.LaunchError) as info:
        launch_timing_out_fast(sleep_then_allreduce, 2, args=(1, 5.0), timeout=0.5)
    failure = info.value.failures[0]
    assert "TimeoutError" in failure and "allreduce" in failure and "rank 1" in failure
    assert "rank(s) [1] never reached this call" in failure


def test_bad_nprocs():
    with pytest.raises(ValueError):
        shmcoll.launch(rank_and_size, 0)


def test_unpicklable_function_is_reported(no_rank_left):
    with pytest.raises(Exception):
        shmcoll.launch(lambda comm: 1, 1)


def test_algorithm_override_from_the_environment(monkeypatch):
    from workers import chosen_algorithms
    monkeypatch.setenv("SHMCOLL_ALGO", "allreduce:direct")
    assert shmcoll.launch(chosen_algorithms, 2) == [["direct", "direct"]] * 2
    monkeypatch.setenv("SHMCOLL_ALGO", "allreduce:tree@0-1K,rhd")
    assert shmcoll.launch(chosen_algorithms, 2) == [["tree", "rhd"]] * 2
    monkeypatch.setenv("SHMCOLL_ALGO", "allreduce:bogus")
    with pytest.raises(ValueError, match="bogus"):
        shmcoll.launch(rank_and_size, 2)


@pytest.fixture
def no_thread_settings(monkeypatch):
    from shmcoll.launch import THREAD_VARIABLES
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_ranks_share_the_cpus_between_their_thread_pools(no_thread_settings):
    from shmcoll._core.topology import usable_cpus
    from workers import thread_pools
    P = 4
    each = max(1, usable_cpus() // P)
    for omp, blas in shmcoll.launch(thread_pools, P):
        assert omp == str(each)
        assert blas in (None, each), "numpy's OpenBLAS runs more threads than it was given"


def test_thread_settings_of_the_caller_are_kept(no_thread_settings, monkeypatch):
    from workers import thread_pools
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert [omp for omp, _ in shmcoll.launch(thread_pools, 3)] == ["2"] * 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert [omp for omp, _ in shmcoll.launch(thread_pools, 2, threads=1)] == ["1"] * 2
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        shmcoll.launch(thread_pools, 2, threads=0)


def test_a_function_the_ranks_cannot_import_is_refused_before_they_start():
    from procs import run
    done = run("-c", "import shmcoll\ndef work(comm):\n    return 1\nshmcoll.launch(work, 2)")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: launch(work)") and "interactive session" in last
    assert "rank 0" not in done.stderr        # refused in the caller: no rank ran

    def nested(comm):
        return 1
    with pytest.raises(TypeError, match="picklable by reference"):
        shmcoll.launch(nested, 2)
