"""Lifecycle of the shared-memory segment behind a communicator.

Names are ``/shmcoll.<uid>.<32 hex digits>``: 128 random bits for jobs started by
``launch``; for jobs joined by name, a hash of the job name keyed by a per-user random
secret (``~/.cache/shmcoll/job-key``), so only the same user can compute it.  Segments are created
mode 0600 with O_EXCL; the rank that completes the attach unlinks the name at once,
so from then on the kernel frees the memory when the last rank unmaps it, whatever
happens to the ranks.

The file is sized sparsely (the all-pairs channel table is mostly address space); the
control part is reserved at creation and each channel by its sender before first use
(the ring channel at attach), so a full /dev/shm raises SharedMemoryFullError or
JoinRefusedError instead of killing ranks with SIGBUS, and channel pages are allocated
on their writer's NUMA node.
"""
import errno
import hashlib
import os
import secrets
import stat
import tempfile
import time

import posix_ipc

from shmcoll import _engine
from shmcoll._core.paths import cache_dir
from shmcoll._core.settings import get
from shmcoll.errors import JoinRefusedError, SegmentError, SharedMemoryFullError, TimeoutError

PREFIX = "shmcoll."
_SHM_DIR = "/dev/shm"


def _name(tag):
    return f"/{PREFIX}{os.geteuid()}.{tag}"


def launch_identity():
    """(name, token) for a job started by launch(): unguessable name and token."""
    return _name(secrets.token_hex(16)), secrets.randbits(63)


_KEY_BYTES = 32


def _key_dirs():
    """Where the job key may live, in the order every process of the user tries them:
    the cache directory, the per-user runtime directory, a private directory in /tmp."""
    dirs = [str(cache_dir())]
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "shmcoll"))
    dirs.append(os.path.join(tempfile.gettempdir(), f"shmcoll-{os.geteuid()}"))
    return dirs


def _private_dir(path):
    """`path` as a directory only this user can use (created if missing), or None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None     # planted by someone else, or readable by others
    return path if os.access(path, os.W_OK | os.X_OK) else None


def _read_key(path):
    """The key at `path`, or None if there is none; a key file that is not this user's
    private regular file of the right length is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SegmentError(f"cannot read the job key {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = f.read()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 \
            or len(key) != _KEY_BYTES:
        raise SegmentError(f"the job key {path} is not a private {_KEY_BYTES}-byte file of this "
                           f"user; remove it to have a new one made")
    return key


def _create_key(directory):
    """Publish a new key atomically: written whole to a temporary file, then linked to
    its name, so that no process ever reads a partial key; if another process linked
    first, its key wins and is returned."""
    path = os.path.join(directory, "job-key")
    fd, tmp = tempfile.mkstemp(prefix=".job-key.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _job_key():
    """A per-user secret (32 random bytes, file mode 0600) that makes job-derived names
    unguessable to other users while every process of this user derives the same.
    The first private, writable directory of _key_dirs() holds it; with none, joining
    by name is refused rather than made guessable."""
    for directory in _key_dirs():
        path = os.path.join(directory, "job-key")
        key = _read_key(path) if os.path.isdir(directory) else None
        if key is not None:
            return key
        if _private_dir(directory) is not None:
            return _create_key(directory)
    raise SegmentError("no private writable directory for the job key (tried "
                       f"{', '.join(_key_dirs())}): set XDG_CACHE_HOME to one, or start the "
                       "job with shmcoll.launch")


def job_identity(job, instance=None):
    """(name, token) for a job joined by name: every process of this user derives the
    same pair, keyed by the user's secret, so the name carries 128 bits no other user
    can compute.  A launch instance id (launch_instance()) makes two launches of one
    job name two jobs."""
    text = f"{os.geteuid()}:{job}" if instance is None else f"{os.geteuid()}:{job}\0{instance}"
    digest = hashlib.blake2b(text.encode(), digest_size=24, key=_job_key()[:64]).digest()
    return _name(digest[:16].hex()), int.from_bytes(digest[16:], "little") >> 1


# Launchers that give every launch an id of its own, the same on all its ranks.
_LAUNCHER_IDS = (("SLURM_JOB_ID", "SLURM_STEP_ID"),    # srun: job and step
                 ("PMIX_NAMESPACE",),                  # PMIx launchers (Open MPI 5, prun)
                 ("OMPI_MCA_ess_base_jobid",))         # Open MPI 4 mpirun


def launch_instance(environ=None):
    """This launch's id: SHMCOLL_JOB_INSTANCE, else the launcher's own, else None."""
    env = os.environ if environ is None else environ
    explicit = get("SHMCOLL_JOB_INSTANCE", env)
    if explicit:
        return explicit
    for names in _LAUNCHER_IDS:
        if all(env.get(n) for n in names):
            return "/".join(f"{n}={env[n]}" for n in names)
    return None


def shm_free_bytes():
    """Bytes free for this user in /dev/shm (None if it cannot be read)."""
    try:
        st = os.statvfs(_SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def create(name, world, params, token):
    """Create, size and format a segment; returns its mapping (a _engine.Segment)."""
    size = _engine.segment_size(world, params)
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        seg = _engine.Segment(shm.fd, size)
        control = _engine.control_bytes(world)
        err = seg.reserve(0, control)
        if err:
            raise _no_space(err, control, world, params)
        # Each rank reserves its own ring channel when it attaches, so that the pages
        # are allocated on its NUMA node (the writer's); refuse here already when they
        # cannot fit, the common case of a full /dev/shm, with one clear error.
        free = shm_free_bytes()
        if free is not None and free < _ring_bytes(world, params):
            raise _no_space(errno.ENOSPC, control, world, params)
        seg.format(world, params, token, os.getpid())
    except BaseException:
        unlink(name)
        raise
    finally:
        shm.close_fd()
    return seg


def _ring_bytes(world, params):
    return world * _engine.channel_bytes(params) if world > 1 else 0


def _no_space(err, control, world, params):
    if err != errno.ENOSPC:
        return SegmentError(f"cannot reserve shared memory for the job: {os.strerror(err)}")
    ring = _ring_bytes(world, params)
    return SharedMemoryFullError(
        f"/dev/shm is too full for a job of {world} ranks: it needs {control + ring} bytes "
        f"({control} of control, {ring} of ring channels), {shm_free_bytes()} bytes free; "
        f"free space there (shmcoll cleanup removes entries of dead jobs) or lower "
        f"SHMCOLL_SLOT_BYTES")


def _own_regular_file(path):
    """The lstat of `path` if it is a regular file of this user, else None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() else None


def _open_entry(path):
    """A descriptor of `path` if it is a regular file of this user, never following a
    link nor blocking on a FIFO; None otherwise or if it does not exist."""
    before = _own_regular_file(path)
    if before is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SegmentError(f"shared segment {path} is not accessible: {e.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)        # replaced between the two looks: judge it next time
        return None
    return fd


def open_existing(name):
    """Map an existing segment, or return None if the name does not exist (yet) or is
    not a regular file of this user."""
    fd = _open_entry(_SHM_DIR + name)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:       # created but not sized yet
            return None
        return _engine.Segment(fd, size)
    finally:
        os.close(fd)


def unlink(name):
    """Remove the name; the memory lives on until every mapping is gone."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def unlink_if_ours(name, seg):
    """Remove the name only while it still names `seg` (not a later job's segment)."""
    try:
        st = os.lstat(_SHM_DIR + name)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == seg.identity():
        unlink(name)


pid_alive = _engine.pid_alive


# How long a segment may stay unformatted before its creator counts as dead.
_FORMAT_GRACE_S = 2.0


def _formatted(name):
    """The segment under `name` once its creator has formatted it; None if there is
    none, or if it stayed unformatted for _FORMAT_GRACE_S (its creator died)."""
    deadline = time.monotonic() + _FORMAT_GRACE_S
    while True:
        seg = open_existing(name)
        if seg is None and not os.path.lexists(_SHM_DIR + name):
            return None
        if seg is not None and seg.world() > 0:
            return seg
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def create_for_job(name, world, params, token):
    """Rank 0 of a joined job: create the segment, replacing one left by a dead job.

    A segment under the name whose creator lives belongs to a job still forming (a
    formed job has unlinked its name): two jobs are starting under one name.  Which
    of the processes arriving belong to which cannot be told, so the forming job is
    refused on every rank and this rank raises too, rather than forming either job
    with the other's members."""
    try:
        return create(name, world, params, token)
    except posix_ipc.ExistentialError:
        pass
    other = _formatted(name)
    creator = other.creator() if other is not None else -1
    if creator > 0 and pid_alive(creator):
        other.refuse(0, _engine.REFUSE_COLLISION, creator, os.getpid())
        raise other.refusal() or JoinRefusedError("the job name is in use by a forming job")
    unlink(name)
    try:
        return create(name, world, params, token)
    except posix_ipc.ExistentialError:
        raise JoinRefusedError("the job cannot form: another job is starting under the same "
                               "name at the same moment; give concurrent jobs distinct "
                               "names") from None


def wait_for_job(name, timeout):
    """A non-zero rank of a joined job: map the segment once rank 0 has formatted it."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        seg = open_existing(name)
        if seg is not None and seg.world() > 0 and pid_alive(seg.creator()):
            refused = seg.refusal()
            if refused is not None:
                raise refused
            return seg
        if time.monotonic() >= deadline:
            raise TimeoutError(f"rank 0 of the job did not create its segment within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def list_entries():
    """Names of the entries in /dev/shm named like this user's shmcoll entries (what
    they are is not checked here: see stale_entries)."""
    prefix = f"{PREFIX}{os.geteuid()}."
    try:
        return sorted(n for n in os.listdir(_SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def stale_entries(min_age=60.0):
    """This user's entries that no live process belongs to: left by a job that died
    before all its ranks attached.  Entries that are not valid segments count only
    once older than `min_age` seconds (a creator may still be formatting them).
    Anything that is not a regular file owned by the caller (a link, a directory, a
    FIFO, another user's file, even for root) is never opened nor counted."""
    stale = []
    for entry in list_entries():
        name = "/" + entry
        st = _own_regular_file(os.path.join(_SHM_DIR, entry))
        if st is None:
            continue
        try:
            seg = open_existing(name)
        except SegmentError:
            continue            # not ours to judge (wrong mode)
        pids = seg.pids() if seg is not None else None
        if pids is None:
            if time.time() - st.st_mtime >= min_age:
                stale.append(name)
        elif not any(pid > 0 and pid_alive(pid) for pid in pids):
            stale.append(name)
    return stale


def remove_stale(name):
    """Unlink an entry stale_entries() returned, if it is still a regular file of this
    user (it may have been replaced since); True if removed."""
    if _own_regular_file(_SHM_DIR + name) is None:
        return False
    unlink(name)
    return True
