"""Python processes for the tests: they import the shmcoll under test, run from the
tests directory, and can be join-mode ranks of a job."""
import contextlib
import os
import subprocess
import sys

import shmcoll
from shmcoll._core import segment

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory holding the shmcoll this test imported (installed or built in place).
ROOT = os.path.dirname(os.path.dirname(shmcoll.__file__))


def python_env(**env):
    paths = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=paths, **{k: str(v) for k, v in env.items()})


def rank_env(job, rank, world):
    return {"SHMCOLL_JOB": job, "SHMCOLL_RANK": rank, "SHMCOLL_WORLD_SIZE": world}


def spawn(*args, **env):
    """Start `python *args` with text pipes for stdout and stderr."""
    return subprocess.Popen([sys.executable, *args], env=python_env(**env), cwd=HERE, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run(*args, timeout=120, **env):
    return subprocess.run([sys.executable, *args], env=python_env(**env), cwd=HERE, text=True,
                          capture_output=True, timeout=timeout)


@contextlib.contextmanager
def cleaned_up(procs, names=()):
    """Kill and reap what a test started, and unlink the job names it may have left."""
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for name in names:
            segment.unlink(name)


def launch_timing_out_fast(fn, nprocs, args=(), timeout=1.0):
    """shmcoll.launch with waits that time out after `timeout` seconds, which bounds
    the join too: a busy machine can start one rank later than that, so a launch
    whose ranks did not all join is tried again (what the tests time out is a call)."""
    for attempt in range(5):
        try:
            return shmcoll.launch(fn, nprocs, args=args, timeout=timeout)
        except shmcoll.LaunchError as e:
            if "never joined the job" not in str(e) or attempt == 4:
                raise
