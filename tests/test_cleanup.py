"""`shmcoll cleanup` removes what a dead job left and never touches a live job."""
import secrets
import signal
import time

from procs import cleaned_up, run, spawn
from shmcoll._core import segment


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


def test_cleanup_never_touches_what_it_did_not_create(tmp_path):
    """Entries named like segments but planted by someone else — a link, a directory, a
    FIFO, another user's file — are skipped: no crash, nothing followed, nothing removed."""
    import os
    uid = os.geteuid()
    planted = {kind: f"/dev/shm/{segment.PREFIX}{uid}.{secrets.token_hex(16)}"
               for kind in ("link", "dir", "fifo", "foreign")}
    target = tmp_path / "target"
    target.write_text("must survive")
    os.symlink(target, planted["link"])
    os.mkdir(planted["dir"])
    os.mkfifo(planted["fifo"], 0o600)
    with open(planted["foreign"], "wb") as f:
        f.write(b"\0" * 4096)
    os.chmod(planted["foreign"], 0o600)
    old = time.time() - 3600         # old enough to count as stale if it were ours
    os.utime(planted["foreign"], (old, old))
    try:
        os.chown(planted["foreign"], uid + 12345, -1)
        foreign_owned = True
    except PermissionError:
        foreign_owned = False
    try:
        for args in ((), ("--dry-run",)):
            res = cleanup(*args)
            assert res.returncode == 0, res.stderr
            for kind, path in planted.items():
                if kind != "foreign" or foreign_owned:
                    assert path not in res.stdout, (kind, res.stdout)
                    assert os.path.lexists(path), kind
        assert target.read_text() == "must survive"
    finally:
        for path in planted.values():
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)
