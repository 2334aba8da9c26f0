"""A rank killed in the middle of collectives: the survivors raise PeerLostError naming
it within about two seconds (from its pid, not from the long timeout)."""
import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

import shmcoll
from workers import kill_self_on

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(shmcoll.__file__))


def start(rank, world, job, count):
    env = dict(os.environ, SHMCOLL_JOB=job, SHMCOLL_RANK=str(rank), SHMCOLL_WORLD_SIZE=str(world),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "loop_rank.py"), str(count)],
                            env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.parametrize("count", [2, 1 << 18, 1 << 24], ids=["8B", "1MiB", "64MiB"])
def test_survivors_name_the_killed_rank(count):
    job = "death-" + secrets.token_hex(4)
    procs = [start(r, 3, job, count) for r in range(3)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "looping"
        time.sleep(0.3)
        killed_at = time.monotonic()
        procs[1].send_signal(signal.SIGKILL)
        for p in (procs[0], procs[2]):
            out, err = p.communicate(timeout=30)
            assert p.returncode == 3, err
            m = re.search(r"lost rank (\d+) at ([\d.]+)", out)
            assert m and int(m.group(1)) == 1, out
            assert float(m.group(2)) - killed_at < 5.0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_launch_names_the_killed_rank_and_its_signal():
    with pytest.raises(shmcoll.LaunchError) as info:
        shmcoll.launch(kill_self_on, 3, args=(2,))
    assert list(info.value.failures) == [2]
    assert "SIGKILL" in info.value.failures[2]
