"""Join mode: processes started by subprocess find each other by job name."""
import json
import re
import secrets

import pytest

import shmcoll
from procs import rank_env, spawn
from shmcoll import segment


def start_ranks(world, job, ranks=None, timeout=20):
    return [spawn("join_rank.py", str(timeout), **rank_env(job, rank, world))
            for rank in (range(world) if ranks is None else ranks)]


def finish(procs, timeout=60):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        outs.append((p.returncode, out, err))
    return outs


@pytest.mark.parametrize("world", [1, 3])
def test_processes_started_by_subprocess_form_one_communicator(world):
    job = "test-" + secrets.token_hex(4)
    # rank 0 last: the others must wait for it to create the job
    procs = start_ranks(world, job, ranks=list(range(world))[::-1])
    results = []
    for code, out, err in finish(procs):
        assert code == 0, err
        results.append(json.loads(out))
    total = world * (world + 1) // 2
    for r in results:
        assert r["world"] == world
        assert r["sum"] == [i * total for i in range(6)]
        assert r["gathered"] == list(range(world))
    assert not any(job in e for e in segment.list_entries())


def test_missing_rank_times_out_with_a_clear_error():
    job = "test-" + secrets.token_hex(4)
    procs = start_ranks(3, job, ranks=[0, 1], timeout=1.0)
    for code, _, err in finish(procs):
        assert code != 0
        assert "TimeoutError" in err
        # rank 2 never comes; under load the other may not have attached in time either
        assert re.search(r"ranks that have not arrived: \[(1, )?2\]", err) or "rank 0" in err, err


def test_rank_zero_absent_times_out():
    job = "test-" + secrets.token_hex(4)
    (code, _, err), = finish(start_ranks(2, job, ranks=[1], timeout=0.5))
    assert code != 0 and "TimeoutError" in err and "rank 0" in err


def test_init_argument_errors():
    with pytest.raises(ValueError, match="needs rank"):
        shmcoll.init(rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank must be"):
        shmcoll.init(rank=2, world_size=2, job="x")
    with pytest.raises(ValueError, match="world_size"):
        shmcoll.init(rank=0, world_size=0, job="x")


def test_single_process_job_in_this_process():
    with shmcoll.init(rank=0, world_size=1, job="solo-" + secrets.token_hex(4)) as comm:
        assert comm.allreduce([1.0, 2.0]).tolist() == [1.0, 2.0]
    assert comm.closed
