"""The one exception hierarchy of shmcoll.

Every failure a caller can see derives from ShmcollError; where a builtin
category fits, the class derives from it too, so ``except TimeoutError`` and
``except ValueError`` catch what they should.
"""
import builtins


class ShmcollError(Exception):
    """Base class of every error raised by shmcoll."""


class TimeoutError(ShmcollError, builtins.TimeoutError):
    """A wait for a peer exceeded the configured timeout (SHMCOLL_TIMEOUT)."""


class PeerLostError(ShmcollError):
    """A peer died or closed its communicator while we were waiting for it."""

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


class DeviceError(ShmcollError):
    """The GPU path cannot run: CuPy or a GPU is missing, peers cannot reach each
    other's memory, or a device array is unsuitable (the message says which)."""


class SegmentError(ShmcollError):
    """A shared segment could not be created, opened or validated."""


class LaunchError(ShmcollError):
    """One or more ranks started by shmcoll.launch raised or died.

    ``failures`` maps rank -> description (traceback text or exit signal).
    """

    def __init__(self, message, failures=None):
        super().__init__(message)
        self.failures = dict(failures or {})
