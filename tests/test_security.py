"""Segments are private to their user and job; malformed ones never crash a process."""
import os
import secrets
import stat
import time

import numpy as np
import pytest

import shmcoll
from procs import cleaned_up, run, spawn
from shmcoll import _engine, segment
from shmcoll.config import EngineParams


def join(job, rank, world, timeout=3.0):
    code = (f"import shmcoll; c = shmcoll.init(rank={rank}, world_size={world}, job={job!r}, "
            f"timeout={timeout}); c.barrier(); print('ok')")
    return spawn("-c", code)


def wait_for_entry(name, proc):
    deadline = time.monotonic() + 30
    while name.lstrip("/") not in segment.list_entries():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)


def test_entries_are_private_to_the_user():
    job = "sec-" + secrets.token_hex(4)
    name, _ = segment.job_identity(job)
    rank0 = join(job, 0, 2, timeout=10)
    with cleaned_up([rank0], [name]):
        wait_for_entry(name, rank0)
        mode = os.stat("/dev/shm" + name).st_mode
        assert stat.S_IMODE(mode) == 0o600
        assert name.startswith(f"/shmcoll.{os.geteuid()}.") and len(name.rsplit(".", 1)[1]) == 32


def test_launch_names_carry_128_random_bits():
    names = {segment.launch_identity()[0] for _ in range(100)}
    assert len(names) == 100 and all(len(n.rsplit(".", 1)[1]) == 32 for n in names)


def test_second_process_claiming_a_rank_is_refused():
    job = "sec-" + secrets.token_hex(4)
    # rank 2 never comes, so the job stays open long enough for both claims of rank 1
    procs = [join(job, 0, 3, timeout=10), join(job, 1, 3, timeout=10), join(job, 1, 3, timeout=10)]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert sum("rank 1 is already taken" in e for e in errs) == 1
    assert all(p.returncode != 0 for p in procs)       # rank 2 never came: the others time out


def test_world_size_disagreement_is_refused():
    job = "sec-" + secrets.token_hex(4)
    first = join(job, 0, 2, timeout=20)
    name, _ = segment.job_identity(job)
    with cleaned_up([first], [name]):
        wait_for_entry(name, first)
        second = join(job, 1, 3)
        err = second.communicate(timeout=60)[1]
        assert second.returncode != 0 and "world size 2" in err and "world_size=3" in err


def test_job_name_in_use_by_a_live_job_is_refused():
    job = "sec-" + secrets.token_hex(4)
    name, _ = segment.job_identity(job)
    first = join(job, 0, 2, timeout=10)
    with cleaned_up([first], [name]):
        wait_for_entry(name, first)
        second = join(job, 0, 2)
        err = second.communicate(timeout=60)[1]
        assert second.returncode != 0 and "already in use" in err


def test_fuzzed_segment_headers_never_crash_an_attach():
    """Random corruption of the header and control blocks: attach refuses it or
    succeeds, but never crashes; the job's token keeps other jobs' segments out."""
    params = EngineParams.from_env(2, timeout=0.2)
    rng = np.random.default_rng(7)
    refused = 0
    for trial in range(200):
        name, token = segment.launch_identity()
        seg = segment.create(name, 2, params, token)
        try:
            raw = np.memmap("/dev/shm" + name, dtype=np.uint8, mode="r+", shape=(8192,))
            where = rng.integers(0, 8192 if trial % 2 else 256, size=rng.integers(1, 16))
            raw[where] = rng.integers(0, 256, size=where.size, dtype=np.uint8)
            raw.flush()
            del raw
            probe = segment.open_existing(name)
            try:
                engine = _engine.Engine(probe, 0, 2, token, params)
                engine.close()
            except shmcoll.SegmentError:
                refused += 1
        finally:
            segment.unlink(name)
            del seg
    assert refused > 0


def test_wrong_token_is_refused():
    params = EngineParams.from_env(2, timeout=0.2)
    name, token = segment.launch_identity()
    seg = segment.create(name, 2, params, token)
    try:
        with pytest.raises(shmcoll.SegmentError, match="not a shmcoll segment of this job"):
            _engine.Engine(segment.open_existing(name), 0, 2, token ^ 1, params)
    finally:
        segment.unlink(name)
        del seg


def test_job_names_are_keyed_by_a_private_per_user_secret():
    key = segment._job_key()
    assert len(key) == 32
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    assert stat.S_IMODE(os.stat(os.path.join(base, "shmcoll", "job-key")).st_mode) == 0o600
    code = "from shmcoll import segment; print(segment.job_identity('same-job')[0])"
    other = run("-c", code).stdout.strip()
    assert other == segment.job_identity("same-job")[0]       # same user: same name
    import hashlib
    unkeyed = hashlib.blake2b(f"{os.geteuid()}:same-job".encode(), digest_size=24).digest()
    assert unkeyed[:16].hex() not in other                    # not computable without the key
