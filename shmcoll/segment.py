"""Lifecycle of the shared-memory segment behind a communicator.

Names are ``/shmcoll.<uid>.<32 hex digits>``: 128 random bits for jobs started by
``launch``; for jobs joined by name, a hash of the job name keyed by a per-user random
secret (``~/.cache/shmcoll/job-key``), so only the same user can compute it.  Segments are created
mode 0600 with O_EXCL; the rank that completes the attach unlinks the name at once,
so from then on the kernel frees the memory when the last rank unmaps it, whatever
happens to the ranks.
"""
import hashlib
import os
import secrets
import time

import posix_ipc

from shmcoll import _engine
from shmcoll.errors import SegmentError, TimeoutError

PREFIX = "shmcoll."
_SHM_DIR = "/dev/shm"


def _name(tag):
    return f"/{PREFIX}{os.geteuid()}.{tag}"


def launch_identity():
    """(name, token) for a job started by launch(): unguessable name and token."""
    return _name(secrets.token_hex(16)), secrets.randbits(63)


def _job_key():
    """A per-user secret (32 random bytes, file mode 0600) that makes job-derived names
    unguessable to other users while every process of this user derives the same."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "shmcoll", "job-key")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        pass
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    except FileExistsError:
        pass            # another process of ours created it first
    except OSError:
        return b""      # no writable cache: names still hash the uid and the job
    with open(path, "rb") as f:
        return f.read()


def job_identity(job):
    """(name, token) for a job joined by name: every process of this user derives the
    same pair, keyed by the user's secret, so the name carries 128 bits no other user
    can compute."""
    digest = hashlib.blake2b(f"{os.geteuid()}:{job}".encode(), digest_size=24,
                             key=_job_key()[:64]).digest()
    return _name(digest[:16].hex()), int.from_bytes(digest[16:], "little") >> 1


def create(name, world, params, token):
    """Create, size and format a segment; returns its mapping (a _engine.Segment)."""
    size = _engine.segment_size(world, params)
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        seg = _engine.Segment(shm.fd, size)
        seg.format(world, params, token, os.getpid())
    except BaseException:
        unlink(name)
        raise
    finally:
        shm.close_fd()
    return seg


def open_existing(name):
    """Map an existing segment, or return None if the name does not exist (yet)."""
    try:
        shm = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        return None
    except posix_ipc.PermissionsError as e:
        raise SegmentError(f"shared segment {name} is not accessible: {e}") from None
    try:
        if shm.size == 0:       # created but not sized yet
            return None
        return _engine.Segment(shm.fd, shm.size)
    finally:
        shm.close_fd()


def unlink(name):
    """Remove the name; the memory lives on until every mapping is gone."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


pid_alive = _engine.pid_alive


def create_for_job(name, world, params, token):
    """Rank 0 of a joined job: create the segment, replacing one left by a dead job."""
    try:
        return create(name, world, params, token)
    except posix_ipc.ExistentialError:
        pass
    stale = open_existing(name)
    creator = stale.creator() if stale is not None else -1
    if creator > 0 and pid_alive(creator):
        raise SegmentError(f"the job name is already in use by a live job (creator pid {creator})")
    unlink(name)
    try:
        return create(name, world, params, token)
    except posix_ipc.ExistentialError:
        raise SegmentError("the job name is already in use by another starting job") from None


def wait_for_job(name, timeout):
    """A non-zero rank of a joined job: map the segment once rank 0 has formatted it."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        seg = open_existing(name)
        if seg is not None and seg.world() > 0 and pid_alive(seg.creator()):
            return seg
        if time.monotonic() >= deadline:
            raise TimeoutError(f"rank 0 of the job did not create its segment within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def list_entries():
    """Names of this user's shmcoll entries in /dev/shm."""
    prefix = f"{PREFIX}{os.geteuid()}."
    try:
        return sorted(n for n in os.listdir(_SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def stale_entries(min_age=60.0):
    """This user's entries that no live process belongs to: left by a job that died
    before all its ranks attached.  Entries that are not valid segments count only
    once older than `min_age` seconds (a creator may still be formatting them)."""
    stale = []
    for entry in list_entries():
        name = "/" + entry
        try:
            seg = open_existing(name)
        except SegmentError:
            continue            # not ours to judge (wrong owner or mode)
        pids = seg.pids() if seg is not None else None
        if pids is None:
            try:
                age = time.time() - os.stat(os.path.join(_SHM_DIR, entry)).st_mtime
            except FileNotFoundError:
                continue
            if age >= min_age:
                stale.append(name)
        elif not any(pid > 0 and pid_alive(pid) for pid in pids):
            stale.append(name)
    return stale
