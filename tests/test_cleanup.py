"""`shmcoll cleanup` removes what a dead job left and never touches a live job."""
import secrets
import signal
import time

from procs import cleaned_up, run, spawn
from shmcoll import segment


def cleanup(*args):
    return run("-m", "shmcoll", "cleanup", *args)


def test_cleanup_removes_a_dead_jobs_entry_and_keeps_a_live_one():
    job = "cleanup-" + secrets.token_hex(4)
    name, _ = segment.job_identity(job)
    code = f"import shmcoll; shmcoll.init(rank=0, world_size=2, job={job!r}, timeout=60)"
    rank0 = spawn("-c", code)
    with cleaned_up([rank0], [name]):
        deadline = time.monotonic() + 30
        while name.lstrip("/") not in segment.list_entries():
            assert time.monotonic() < deadline and rank0.poll() is None
            time.sleep(0.05)
        res = cleanup()                      # rank 0 is alive, waiting for rank 1
        assert res.returncode == 0 and name not in res.stdout
        assert name.lstrip("/") in segment.list_entries()
        rank0.send_signal(signal.SIGKILL)    # dies before rank 1 ever attaches
        rank0.wait()
        assert name.lstrip("/") in segment.list_entries()
        res = cleanup("--dry-run")
        assert f"stale /dev/shm{name}" in res.stdout
        assert name.lstrip("/") in segment.list_entries()
        res = cleanup()
        assert f"removed /dev/shm{name}" in res.stdout
        assert name.lstrip("/") not in segment.list_entries()
