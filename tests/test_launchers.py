"""init() with no arguments joins from the environment of the launcher that started
the process: shmcoll run, torchrun, Open MPI, MPICH/PMI, Slurm; what is ambiguous or
incomplete is refused naming the variables found."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import procs
from shmcoll._core import launchers

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc",
            "TORCHELASTIC_RESTART_COUNT": "0"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "PMIX_NAMESPACE": "prterun-host-1234@1"}
MPICH = {"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3",
         "PMI_FD": "7"}
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3", "SLURM_JOB_ID": "991",
         "SLURM_STEP_ID": "2", "SLURM_STEP_NUM_NODES": "1"}


@pytest.mark.parametrize("env,rank,world,launcher,job_part", [
    (TORCHRUN, 1, 2, "torchrun", "MASTER_PORT=29500"),
    (OPEN_MPI, 2, 4, "Open MPI", "PMIX_NAMESPACE=prterun-host-1234@1"),
    (dict(OPEN_MPI, PMIX_NAMESPACE="", OMPI_MCA_ess_base_jobid="77"), 2, 4, "Open MPI",
     "OMPI_MCA_ess_base_jobid=77"),
    (MPICH, 0, 3, "MPICH/PMI", f"parent process {os.getppid()}"),
    (dict(MPICH, PMI_KVSNAME="kvs_42"), 0, 3, "MPICH/PMI", "PMI_KVSNAME=kvs_42"),
    (SLURM, 3, 4, "Slurm", "SLURM_JOB_ID=991/SLURM_STEP_ID=2"),
])
def test_each_launcher(env, rank, world, launcher, job_part):
    launch = launchers.detect(env)
    assert (launch.rank, launch.world_size, launch.launcher) == (rank, world, launcher)
    assert job_part in launch.job and launch.instance and launch.instance in launch.job


def test_a_restarted_torchrun_worker_group_is_a_new_job():
    first = launchers.detect(TORCHRUN)
    again = launchers.detect(dict(TORCHRUN, TORCHELASTIC_RESTART_COUNT="1"))
    other_run = launchers.detect(dict(TORCHRUN, MASTER_PORT="29501"))
    assert len({first.job, again.job, other_run.job}) == 3


def test_the_innermost_launcher_decides():
    """torchrun started by srun: torchrun's variables (set last, per worker) win."""
    launch = launchers.detect(dict(SLURM, **TORCHRUN))
    assert (launch.launcher, launch.rank, launch.world_size) == ("torchrun", 1, 2)


def test_no_launcher():
    assert launchers.detect({"HOME": "/root"}) is None


@pytest.mark.parametrize("env,words", [
    ({"RANK": "0"}, ["WORLD_SIZE", "RANK=0"]),
    (dict(TORCHRUN, WORLD_SIZE="two"), ["WORLD_SIZE='two'", "not an integer"]),
    (dict(TORCHRUN, RANK="5"), ["rank 5 of 2"]),
    (dict(TORCHRUN, WORLD_SIZE="8", LOCAL_WORLD_SIZE="4"), ["more than one machine",
                                                            "LOCAL_WORLD_SIZE=4"]),
    (dict(SLURM, SLURM_STEP_NUM_NODES="2"), ["more than one machine",
                                             "SLURM_STEP_NUM_NODES=2"]),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, ["no job id",
                                                                  "SHMCOLL_JOB"]),
    ({"RANK": "0", "WORLD_SIZE": "2"}, ["no job id", "RANK=0", "WORLD_SIZE=2"]),
])
def test_incomplete_or_ambiguous_environments_are_refused(env, words):
    with pytest.raises(ValueError) as e:
        launchers.detect(env)
    for word in words:
        assert word in str(e.value)


def _rank_processes(envs):
    return [procs.spawn("join_from_launcher.py", **env) for env in envs]


def _clear_shmcoll(env):
    return dict({k: "" for k in ("SHMCOLL_RANK", "SHMCOLL_WORLD_SIZE", "SHMCOLL_JOB",
                                 "SHMCOLL_JOB_INSTANCE")}, **env)


@pytest.mark.parametrize("make_env", [
    lambda r, n, job: {"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": n,
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": job,
                       "TORCHELASTIC_RUN_ID": "none"},
    lambda r, n, job: {"OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": n,
                       "OMPI_COMM_WORLD_LOCAL_RANK": r, "OMPI_COMM_WORLD_LOCAL_SIZE": n,
                       "OMPI_MCA_ess_base_jobid": job},
    lambda r, n, job: {"PMI_RANK": r, "PMI_SIZE": n, "MPI_LOCALRANKID": r,
                       "MPI_LOCALNRANKS": n, "PMI_PORT": f"host:{job}"},
    lambda r, n, job: {"SLURM_PROCID": r, "SLURM_NTASKS": n, "SLURM_LOCALID": r,
                       "SLURM_JOB_ID": "5", "SLURM_STEP_ID": job, "SLURM_STEP_NUM_NODES": "1"},
], ids=["torchrun", "openmpi", "mpich", "slurm"])
def test_two_launches_at_once_under_each_scheme(make_env):
    """Two jobs of two ranks each, started together, with their launcher's variables:
    each forms its own communicator (its job id differs), none waits for the other."""
    envs = [_clear_shmcoll(make_env(r, 2, job)) for job in ("4001", "4002") for r in range(2)]
    ps = _rank_processes(envs)
    with procs.cleaned_up(ps):
        outs = []
        for p in ps:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(out.split())
    assert outs == [["0", "2", "3.0"], ["1", "2", "3.0"]] * 2


def test_init_under_real_torchrun(tmp_path):
    pytest.importorskip("torch.distributed")
    # (TMPDIR: torchrun leaves its log directories behind)
    res = procs.run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "join_from_launcher.py", timeout=180,
                    **_clear_shmcoll({"TMPDIR": str(tmp_path)}))
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(re.findall(r"\d 2 3\.0", res.stdout)) == ["0 2 3.0", "1 2 3.0"]


def test_explicit_arguments_and_shmcoll_variables_come_first():
    """SHMCOLL_* (and arguments) win over a launcher's variables present beside them."""
    envs = [dict(TORCHRUN, SHMCOLL_RANK=str(r), SHMCOLL_WORLD_SIZE="2",
                 SHMCOLL_JOB="explicit-first", SHMCOLL_JOB_INSTANCE="i1", RANK="0",
                 WORLD_SIZE="1", LOCAL_WORLD_SIZE="1") for r in range(2)]
    ps = _rank_processes(envs)
    with procs.cleaned_up(ps):
        outs = sorted(p.communicate(timeout=120)[0] for p in ps)
    assert [o.split() for o in outs] == [["0", "2", "3.0"], ["1", "2", "3.0"]]


def _mpiexec():
    """The mpiexec of this environment (the test extra's MPICH wheel puts it beside the
    interpreter), else one on PATH; None without one."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


def test_init_under_real_mpiexec():
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec installed")
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    extra = ["--allow-run-as-root", "--oversubscribe"] if "Open MPI" in version else []
    res = subprocess.run([mpiexec, *extra, "-n", "3", sys.executable, "join_from_launcher.py"],
                         env=procs.python_env(**_clear_shmcoll({})), cwd=procs.HERE,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(re.findall(r"\d 3 6\.0", res.stdout)) == ["0 3 6.0", "1 3 6.0", "2 3 6.0"]
