"""/dev/shm too full for a job: a clear error naming the space needed and left, never
SIGBUS at first touch, nothing left behind.  Each case runs in a private mount
namespace whose /dev/shm is a tmpfs of a chosen size (needs root's unshare and mount;
skipped where they are not allowed)."""
import json
import shutil
import subprocess

import pytest

from procs import HERE, python_env

KIB = 1 << 10


def run_in_small_shm(size_kib, world, algo, **env):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.decode().strip()}")
    script = (f"mount -t tmpfs -o size={size_kib}k tmpfs /dev/shm && "
              f"exec \"$0\" shm_full.py {world} {algo}")
    import sys
    res = subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable], cwd=HERE,
                         env=python_env(**env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def no_signal_deaths(report):
    for text in report.get("failures", {}).values():
        assert "signal" not in text, text


def test_segment_that_cannot_be_created_names_the_space():
    report = run_in_small_shm(8, 2, "auto")
    assert report["error"] == "SharedMemoryFullError", report
    assert "bytes free" in report["message"] and "needs" in report["message"]
    assert report["left"] == []


def test_ring_channels_that_do_not_fit_are_refused_before_any_rank_starts():
    # room for the control part and one rank's ring channel (1 MiB), not the other's
    report = run_in_small_shm(1536, 2, "auto")
    assert report["error"] == "SharedMemoryFullError", report
    assert "ring channels" in report["message"] and "bytes free" in report["message"]
    assert report["left"] == []


def test_channel_first_used_by_a_later_call_fails_that_call_cleanly():
    # 3 ranks, 256 KiB channels: the ring's three fit, the all-pairs one-shot's six do not
    report = run_in_small_shm(1024 + 64, 3, "direct", SHMCOLL_SLOT_BYTES=64 * KIB,
                              SHMCOLL_SLOTS=4)
    no_signal_deaths(report)
    outcomes = report.get("outcomes") or []
    failures = report.get("failures") or {}
    kinds = [o[0] for o in outcomes] + [t for t in failures.values()]
    assert any("SharedMemoryFullError" in k for k in kinds), report
    full = next(o[1] for o in outcomes if o[0] == "SharedMemoryFullError") if outcomes else \
        next(t for t in failures.values() if "SharedMemoryFullError" in t)
    assert "bytes needed" in full and "free" in full, full
    assert report["left"] == []


def test_rank_whose_channel_cannot_be_backed_at_join_refuses_the_job_on_every_rank():
    report = run_in_small_shm(4096, "join", "-", SHMCOLL_JOIN_GRACE=0)
    for kind, text in report["outcomes"]:
        assert kind == "JoinRefusedError" and "/dev/shm is too full: rank 1 needed" in text, report
    assert report["left"] == []


def test_symmetric_allocation_that_does_not_fit_raises_on_every_rank():
    # room for the job (control and two 1 MiB ring channels), not for 2 x 4 MiB slices
    report = run_in_small_shm(4096, 2, "symmetric")
    for (kind, text), total in report["outcomes"]:
        assert kind == "SharedMemoryFullError" and "symmetric allocation" in text, report
        assert total == 3.0
    assert report["left"] == []
