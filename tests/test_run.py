"""`shmcoll run`: any program started as N ranks with the launch variables, output
tagged, failures and signals ending the job with the first failure's status."""
import json
import os
import signal
import sys

import pytest

import procs
from shmcoll._core import segment
from shmcoll._core.topology import usable_cpus
from shmcoll.tools import run as shmcoll_run


def run(*words, timeout=120, **env):
    return procs.run("-m", "shmcoll", "run", *words, timeout=timeout, **env)


def env_lines(stdout):
    return sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
                  key=lambda e: int(e["SHMCOLL_RANK"]))


def test_a_script_gets_the_launch_variables():
    res = run("-np", "3", "--threads", "2", "run_target.py", "env")
    assert res.returncode == 0, res.stderr
    ranks = env_lines(res.stdout)
    assert [e["SHMCOLL_RANK"] for e in ranks] == ["0", "1", "2"]
    assert [e["RANK"] for e in ranks] == [e["LOCAL_RANK"] for e in ranks] == ["0", "1", "2"]
    for e in ranks:
        assert e["SHMCOLL_WORLD_SIZE"] == e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["OMP_NUM_THREADS"] == e["OPENBLAS_NUM_THREADS"] == e["MKL_NUM_THREADS"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1" and int(e["MASTER_PORT"]) > 0
    assert len({(e["SHMCOLL_JOB"], e["MASTER_PORT"]) for e in ranks}) == 1


def test_threads_default_to_a_share_of_the_cpus():
    env = {v: "" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    res = run("-np", "2", "run_target.py", "env", **env)
    assert res.returncode == 0, res.stderr
    share = str(max(1, usable_cpus() // 2))
    assert {e["OMP_NUM_THREADS"] for e in env_lines(res.stdout)} == {share}


@pytest.mark.parametrize("threads,expected", [(1, 1), (2, 2)])
def test_blas_starts_the_threads_it_was_given(threads, expected):
    """What the thread variables do, seen from inside: the rank's BLAS pool has that
    many threads (the rank's tasks in /proc after a matrix product)."""
    res = run("-np", "1", "--threads", str(threads), "run_target.py", "threads")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["threads"] == expected


def test_a_module_and_an_executable():
    res = run("-np", "2", "-m", "run_target", "env")
    assert res.returncode == 0, res.stderr
    assert [e["SHMCOLL_RANK"] for e in env_lines(res.stdout)] == ["0", "1"]
    res = run("-np", "2", "sh", "-c", 'echo "rank=$SHMCOLL_RANK of $SHMCOLL_WORLD_SIZE"')
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == sorted("rank=0 of 2 rank=1 of 2".split())


def test_ranks_join_with_init_and_no_arguments():
    res = run("-np", "3", "run_target.py", "allreduce")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"rank {r} of 3: 6.0" for r in range(3)]


def test_two_runs_at_once_are_two_jobs():
    first = procs.spawn("-m", "shmcoll", "run", "-np", "2", "run_target.py", "allreduce")
    second = procs.spawn("-m", "shmcoll", "run", "-np", "2", "run_target.py", "allreduce")
    with procs.cleaned_up([first, second]):
        for p in (first, second):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            assert sorted(out.splitlines()) == ["rank 0 of 2: 3.0", "rank 1 of 2: 3.0"]


def test_ranks_are_bound_where_the_topology_places_them():
    from shmcoll._core import topology
    places = topology.placement(topology.discover(), 2, "core")
    res = run("--bind", "core", "--tag-output", "-np", "2", "sh", "-c",
              "grep Cpus_allowed_list /proc/self/status")
    assert res.returncode == 0, res.stderr
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    for r in range(2):
        allowed = got[f"[{r}]"].split(":")[1].strip()
        cpus = set()
        for part in allowed.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        assert cpus == set(places[r])


def test_output_is_tagged_with_the_rank():
    res = run("--tag-output", "-np", "2", "sh", "-c", "echo out; echo err >&2; printf tail")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[0] out", "[0] tail", "[1] out", "[1] tail"]
    assert sorted(line for line in res.stderr.splitlines() if line.startswith("[")) == [
        "[0] err", "[1] err"]


def test_a_failing_rank_ends_the_job_with_its_status():
    # the others sleep far longer than run()'s timeout: returning at all means they
    # were stopped, not waited for
    res = run("-np", "3", "run_target.py", "fail", "1", "3")
    assert res.returncode == 3
    assert "rank 1 exited with status 3" in res.stderr


def test_a_rank_killed_by_a_signal():
    res = run("-np", "2", "run_target.py", "kill", "1", "SIGKILL")
    assert res.returncode == 128 + signal.SIGKILL
    assert "rank 1 was killed by SIGKILL" in res.stderr


def test_ctrl_c_is_passed_on_and_ends_every_rank():
    p = procs.spawn("-m", "shmcoll", "run", "-np", "2", "run_target.py", "sleep")
    with procs.cleaned_up([p]):
        ready = set()
        while len(ready) < 2:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            ready.add(line.strip())
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 128 + signal.SIGINT
        assert "SIGINT passed on to every rank" in err


def test_the_timeout_stops_the_job():
    res = run("--timeout", "1", "-np", "2", "run_target.py", "sleep")
    assert res.returncode == shmcoll_run.EXIT_TIMEOUT
    assert "timed out" in res.stderr


def test_no_entry_outlives_a_rank_that_died_while_joining():
    before = set(segment.list_entries())
    res = run("-np", "2", "sh", "-c",
              f'[ "$SHMCOLL_RANK" = 1 ] && exit 5; exec {sys.executable} -c '
              f'"import shmcoll; shmcoll.init()"', SHMCOLL_TIMEOUT="30")
    assert res.returncode == 5
    assert set(segment.list_entries()) - before == set()


def test_what_the_command_refuses():
    assert run("-np", "2").returncode != 0
    res = run("-np", "2", "no-such-program-anywhere")
    assert res.returncode != 0 and "not found" in res.stderr
    res = run("-np", "0", "run_target.py", "env")
    assert res.returncode != 0 and "-np" in res.stderr


def test_the_command_line_is_split_where_the_program_starts():
    split = shmcoll_run.split_argv
    assert split(["-np", "2", "x.py", "-np", "3"]) == (["-np", "2"], ["x.py", "-np", "3"])
    assert split(["-np", "2", "--tag-output", "-m", "pkg", "--flag"]) == (
        ["-np", "2", "--tag-output"], ["-m", "pkg", "--flag"])
    assert split(["-np", "2", "--", "-weird"]) == (["-np", "2"], ["-weird"])
    assert shmcoll_run.describe(-signal.SIGSEGV) == ("was killed by SIGSEGV", 139)
    assert shmcoll_run.describe(4) == ("exited with status 4", 4)


def test_the_run_command_is_listed():
    res = procs.run("-m", "shmcoll", "--help")
    assert "run" in res.stdout
    assert os.path.basename(shmcoll_run.__file__) == "run.py"
