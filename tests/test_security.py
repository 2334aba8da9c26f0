"""Segments are private to their user and job; malformed ones never crash a process."""
import os
import secrets
import stat
import time

import numpy as np
import pytest

import shmcoll
from procs import cleaned_up, run, spawn
from shmcoll import _engine
from shmcoll._core import segment
from shmcoll._core.settings import EngineParams


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


def test_second_process_claiming_a_rank_is_refused_on_every_rank_at_once():
    job = "sec-" + secrets.token_hex(4)
    # rank 2 never comes, so the job stays open for both claims of rank 1; the timeout
    # is far longer than the test may take: every rank must learn of the refusal at once
    procs = [join(job, 0, 3, timeout=600), join(job, 1, 3, timeout=600),
             join(job, 1, 3, timeout=600)]
    with cleaned_up(procs, [segment.job_identity(job)[0]]):
        errs = [p.communicate(timeout=60)[1] for p in procs]
    assert all(p.returncode != 0 for p in procs)
    for err in errs:
        assert "JoinRefusedError" in err and "rank 1 is already taken" in err, err


def test_world_size_disagreement_is_refused():
    job = "sec-" + secrets.token_hex(4)
    first = join(job, 0, 2, timeout=20)
    name, _ = segment.job_identity(job)
    with cleaned_up([first], [name]):
        wait_for_entry(name, first)
        second = join(job, 1, 3)
        err = second.communicate(timeout=60)[1]
        assert second.returncode != 0
        assert "rank 1 passed world size 3, but the job was created for 2" in err, err
        first_err = first.communicate(timeout=60)[1]        # rank 0 learns of it at once
        assert first.returncode != 0 and "passed world size 3" in first_err, first_err


def test_second_job_forming_under_a_live_jobs_name_refuses_both():
    """Which arriving process belongs to which job cannot be told from the name: a
    second rank 0 refuses the forming job on all its ranks and raises itself."""
    job = "sec-" + secrets.token_hex(4)
    name, _ = segment.job_identity(job)
    first = join(job, 0, 2, timeout=600)
    with cleaned_up([first], [name]):
        wait_for_entry(name, first)
        second = join(job, 0, 2)
        err = second.communicate(timeout=60)[1]
        assert second.returncode != 0 and "second job is forming under the same job name" in err
        first_err = first.communicate(timeout=60)[1]
        assert first.returncode != 0 and "second job is forming" in first_err, first_err


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
    code = "from shmcoll._core import segment; print(segment.job_identity('same-job')[0])"
    other = run("-c", code).stdout.strip()
    assert other == segment.job_identity("same-job")[0]       # same user: same name
    import hashlib
    unkeyed = hashlib.blake2b(f"{os.geteuid()}:same-job".encode(), digest_size=24).digest()
    assert unkeyed[:16].hex() not in other                    # not computable without the key


def _key_in(env, timeout=60):
    res = run("-c", "from shmcoll._core import segment; print(segment._job_key().hex())",
              timeout=timeout, **env)
    return res


KEY_RACER = """
import os, sys, time
from shmcoll._core import segment
base, t0, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
for i in range(rounds):
    os.environ["XDG_CACHE_HOME"] = os.path.join(base, str(i))
    time.sleep(max(0.0, t0 + 0.05 * i - time.time()))
    print(segment._job_key().hex(), flush=True)
"""


def test_racing_first_use_of_the_key_gives_every_process_the_same_key(tmp_path):
    """Processes reach for the key of a fresh cache directory at one instant, round
    after round: the key is published whole (temporary file, then link), so in every
    round all read the same 32 bytes and no temporary file is left."""
    rounds, racers = 60, 6
    t0 = time.time() + 3.0
    procs = [spawn("-c", KEY_RACER, str(tmp_path), str(t0), str(rounds)) for _ in range(racers)]
    with cleaned_up(procs):
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outputs.append(out.split())
    for i in range(rounds):
        keys = {out[i] for out in outputs}
        assert len(keys) == 1 and len(keys.pop()) == 64, (i, {out[i] for out in outputs})
        assert sorted(os.listdir(tmp_path / str(i) / "shmcoll")) == ["job-key"]


def test_four_ranks_joining_on_a_fresh_cache_form_the_job(tmp_path):
    for round_ in range(2):
        job = "fresh-" + secrets.token_hex(4)
        env = {"XDG_CACHE_HOME": str(tmp_path / f"c{round_}"), "SHMCOLL_JOB": job,
               "SHMCOLL_WORLD_SIZE": 4}
        procs = [spawn("join_rank.py", "30", SHMCOLL_RANK=r, **env) for r in range(4)]
        with cleaned_up(procs):
            for p in procs:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, err


def test_unwritable_cache_falls_back_to_a_private_directory(tmp_path):
    env = {"XDG_CACHE_HOME": "/dev/null/cache", "XDG_RUNTIME_DIR": "", "TMPDIR": str(tmp_path)}
    first, second = _key_in(env), _key_in(env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr
    assert first.stdout == second.stdout and len(first.stdout.strip()) == 64
    private = tmp_path / f"shmcoll-{os.geteuid()}"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(private / "job-key").st_mode) == 0o600


@pytest.mark.parametrize("plant", ["file", "open-dir", "link"])
def test_no_private_directory_refuses_instead_of_weakening_names(tmp_path, plant):
    private = tmp_path / f"shmcoll-{os.geteuid()}"
    if plant == "file":
        private.write_text("")
    elif plant == "open-dir":
        private.mkdir()
        os.chmod(private, 0o777)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        os.symlink(tmp_path / "elsewhere", private)
    env = {"XDG_CACHE_HOME": "/dev/null/cache", "XDG_RUNTIME_DIR": "", "TMPDIR": str(tmp_path)}
    res = run("-c", "import shmcoll; shmcoll.init(rank=0, world_size=1, job='j')", **env)
    assert res.returncode != 0 and "SegmentError" in res.stderr, res.stderr
    assert "no private writable directory" in res.stderr


@pytest.mark.parametrize("plant", ["link", "short", "shared"])
def test_a_planted_key_is_refused(tmp_path, plant):
    directory = tmp_path / "shmcoll"
    directory.mkdir(mode=0o700)
    key = directory / "job-key"
    if plant == "link":
        (tmp_path / "their-key").write_bytes(b"k" * 32)
        os.symlink(tmp_path / "their-key", key)
    else:
        key.write_bytes(b"k" * (4 if plant == "short" else 32))
        os.chmod(key, 0o644 if plant == "shared" else 0o600)
    res = _key_in({"XDG_CACHE_HOME": str(tmp_path)})
    assert res.returncode != 0 and "SegmentError" in res.stderr and "job key" in res.stderr
