"""The one exception hierarchy of shmcoll.

Every failure a caller can see derives from ShmcollError; where a builtin
category fits, the class derives from it too, so ``except TimeoutError`` and
``except ValueError`` catch what they should.
"""
import builtins


class ShmcollError(Exception):
    """Base class of every error raised by shmcoll."""


class TimeoutError(ShmcollError, builtins.TimeoutError):
    """A wait for a peer exceeded the configured timeout (SHMCOLL_TIMEOUT).

    ``ranks`` lists the ranks the job was waiting for: those that never reached the
    call (or never joined) when any did not, else the peer this rank waited for.
    """

    def __init__(self, message, ranks=()):
        super().__init__(message)
        self.ranks = list(ranks)


class PeerLostError(ShmcollError):
    """A peer died or closed its communicator while we were waiting for it, or gave up
    on the call this rank was finishing."""

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


class MismatchError(ShmcollError, ValueError):
    """Ranks called different collectives, or the same one with different arguments.

    Raised on every rank of the job; ``field`` names what differed (collective,
    count, dtype, op, root, algorithm) and ``ranks`` the two ranks compared.
    The communicator is unusable afterwards.
    """

    def __init__(self, message, field=None, ranks=()):
        super().__init__(message)
        self.field = field
        self.ranks = tuple(ranks)


class JobAbortedError(ShmcollError):
    """Another rank of the job failed and marked the job as aborted."""


class CommunicatorBrokenError(ShmcollError):
    """An earlier collective failed half-way; the communicator cannot be used again."""


class ClosedError(ShmcollError, ValueError):
    """The communicator was closed."""


class ConcurrentCallError(ShmcollError, RuntimeError):
    """Two threads of one process called into the same communicator at once.  A
    communicator serves one call at a time; the second call is refused before it
    touches anything, and the first goes on unharmed."""


class OutOfMemoryError(ShmcollError, MemoryError):
    """Process memory for the engine's own state could not be allocated."""


class DeviceError(ShmcollError):
    """The GPU path cannot run: CuPy or a GPU is missing, peers cannot reach each
    other's memory, or a device array is unsuitable (the message says which)."""


class SegmentError(ShmcollError):
    """A shared segment could not be created, opened or validated."""


class SharedMemoryFullError(SegmentError, MemoryError):
    """/dev/shm has too little space left to back the job's shared memory; the
    message names the bytes needed and the bytes free."""


class JoinRefusedError(SegmentError):
    """A rank was refused when joining (another world size, a rank already taken, a
    second job forming under the same name, no shared memory for its channel).
    Raised at once on every rank of the job, naming the refused rank and why.
    ``rank`` is that rank; ``reason`` the engine's code for why."""

    def __init__(self, message, rank=None, reason=None):
        super().__init__(message)
        self.rank = rank
        self.reason = reason


class LaunchError(ShmcollError):
    """One or more ranks started by shmcoll.launch raised or died.

    ``failures`` maps rank -> description (traceback text or exit signal).
    """

    def __init__(self, message, failures=None):
        super().__init__(message)
        self.failures = dict(failures or {})
