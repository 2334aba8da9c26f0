"""Signals to the launching process: its ranks go away and nothing is left in /dev/shm."""
import re
import signal
import time

import pytest

from procs import cleaned_up, spawn
from shmcoll._core import segment


def alive(pid):
    return segment.pid_alive(pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_signalled_launcher_leaves_no_rank_and_no_entry(sig):
    before = set(segment.list_entries())
    launcher = spawn("launcher_victim.py")
    with cleaned_up([launcher]):
        seen = ""
        while len(re.findall(r"pid (\d+)", seen)) < 2:
            line = launcher.stdout.readline()
            assert line, "the launcher ended before both ranks reported"
            seen += line
        pids = [int(p) for p in re.findall(r"pid (\d+)", seen)]
        time.sleep(0.3)
        launcher.send_signal(sig)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
        assert set(segment.list_entries()) <= before


def test_launcher_killed_under_a_subreaper_takes_its_starting_ranks_along():
    """Killed before its ranks asked to die with it, under a subreaper the ranks are
    re-parented to that process, not to init: they must still notice and exit."""
    import json
    from procs import run
    before = set(segment.list_entries())
    res = run("subreaper_harness.py", timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    if "skip" in report:
        pytest.skip(report["skip"])
    assert report["orphans"] >= 2 and report["survivors"] == 0, report
    assert set(segment.list_entries()) <= before
