"""Join mode: processes started by subprocess find each other by job name."""
import json
import re
import secrets

import pytest

import shmcoll
from procs import rank_env, spawn
from shmcoll._core import segment


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
        assert re.search(r"rank\(s\) \[(1, )?2\] never joined the job", err) or "rank 0" in err, err


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


@pytest.mark.parametrize("name,value", [("SHMCOLL_ALGO", "allreduce:bogus"),
                                        ("SHMCOLL_CMA", "sometimes")])
def test_a_bad_setting_fails_before_rank_zero_creates_the_segment(monkeypatch, name, value):
    """Rank 0 would otherwise leave the job's segment name behind, and its peers
    waiting for a job that never forms."""
    monkeypatch.setenv(name, value)
    job = "bad-setting-" + secrets.token_hex(4)
    before = set(segment.list_entries())
    with pytest.raises(ValueError, match=name):
        shmcoll.init(rank=0, world_size=2, job=job, timeout=5)
    assert set(segment.list_entries()) == before


def test_single_process_job_in_this_process():
    with shmcoll.init(rank=0, world_size=1, job="solo-" + secrets.token_hex(4)) as comm:
        assert comm.allreduce([1.0, 2.0]).tolist() == [1.0, 2.0]
    assert comm.closed


def _twins(job, starts, **env):
    """Jobs A (values 1) and B (values 100) of two ranks each under one job name; the
    process (job, rank) sleeps until starts[(job, rank)].  Returns each one's outcome
    in the order A0, A1, B0, B1."""
    import time
    from procs import cleaned_up
    t0 = time.time() + 1.5
    procs = [spawn("same_name_rank.py", str(value), str(t0 + starts[(j, r)]), "6",
                   **rank_env(job, r, 2), **env.get(j, {}))
             for j, value in (("A", 1), ("B", 100)) for r in range(2)]
    with cleaned_up(procs, [segment.job_identity(job)[0]]):
        return [json.loads(p.communicate(timeout=120)[0]) for p in procs]


def _never_mixed(outcomes):
    for (kind, value), own in zip(outcomes, (2, 2, 200, 200)):
        if kind == "ok":
            assert value == own, outcomes
        else:
            assert kind in ("JoinRefusedError", "TimeoutError"), outcomes


SAME_MOMENT = {(j, r): 0.0 for j in "AB" for r in range(2)}


def test_two_launches_with_instance_ids_under_one_name_both_form():
    for round_ in range(2):
        job = "twin-" + secrets.token_hex(4)
        outcomes = _twins(job, SAME_MOMENT, A={"SHMCOLL_JOB_INSTANCE": "launch-a"},
                          B={"SHMCOLL_JOB_INSTANCE": "launch-b"})
        assert outcomes == [["ok", 2.0], ["ok", 2.0], ["ok", 200.0], ["ok", 200.0]], outcomes


def test_two_jobs_started_at_once_under_one_name_never_mix_members():
    """No instance id: a rank gets its own job's sum or a clear error, never a sum of
    members of both jobs."""
    grace = {"SHMCOLL_JOIN_GRACE": "5"}     # wider than any start-up jitter of the four
    for round_ in range(2):
        _never_mixed(_twins("twin-" + secrets.token_hex(4), SAME_MOMENT, A=grace, B=grace))


def test_interleaved_arrivals_that_would_swap_members_are_refused_on_every_rank():
    """A0 creates, B1 joins it (the job is complete), then B0 and A1 arrive: without
    the grace both jobs would form, each with the other's rank 1."""
    grace = {"SHMCOLL_JOIN_GRACE": "3"}
    starts = {("A", 0): 0.0, ("B", 1): 0.3, ("B", 0): 0.9, ("A", 1): 1.2}
    outcomes = _twins("twin-" + secrets.token_hex(4), starts, A=grace, B=grace)
    assert [kind for kind, _ in outcomes] == ["JoinRefusedError"] * 4, outcomes


def test_launch_instance_comes_from_the_launcher():
    assert segment.launch_instance({}) is None
    assert segment.launch_instance({"SHMCOLL_JOB_INSTANCE": "x", "PMIX_NAMESPACE": "p"}) == "x"
    assert segment.launch_instance({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) == \
        "SLURM_JOB_ID=7/SLURM_STEP_ID=0"
    assert segment.launch_instance({"SLURM_JOB_ID": "7"}) is None     # a job, not a step
    assert segment.job_identity("j", "a") != segment.job_identity("j", "b") != \
        segment.job_identity("j")


def _wait_attached(job, ranks, procs):
    """Until `ranks` of the forming job have attached to its segment."""
    import time
    name, _ = segment.job_identity(job)
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        seg = segment.open_existing(name)
        pids = seg.pids() if seg is not None else None
        if pids and all(pids[1 + r] > 0 for r in ranks):
            return
        time.sleep(0.02)


def test_refused_rank_makes_every_rank_fail_at_once():
    """Ranks 0 and 1 have attached when rank 2 arrives with another world size: all
    three fail at once naming it (their timeout is far longer than the test may take).
    (A rank arriving after the refused job unwound waits for a new rank 0 instead.)"""
    job = "test-" + secrets.token_hex(4)
    procs = [spawn("join_rank.py", "600", **rank_env(job, r, 3)) for r in (0, 1)]
    _wait_attached(job, (0, 1), procs)
    wrong = spawn("join_rank.py", "600", **rank_env(job, 2, 4))
    for code, _, err in finish(procs + [wrong]):
        assert code != 0
        assert "JoinRefusedError" in err and "rank 2 passed world size 4" in err, err
