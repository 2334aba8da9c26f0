"""shmcoll.Work: what a collective called with ``async_op=True`` returns.

A Work is the call in flight.  Collectives complete in the order they were issued on
their communicator, whatever order their Works are waited in, and a blocking
collective issued meanwhile runs after them; a send or receive completes as soon as
its own message has moved (a blocking one joins the sends and receives queued before
it).  Messages and collectives go on two queues, each with its thread, and never wait
for each other.  Until ``wait()`` has returned (or ``is_completed()`` is true) the
caller must not write the call's input nor read or write its ``out`` (for broadcast,
x): the communicator's progress threads read and write them meanwhile.
A failure inside the call is raised by ``wait()`` (and returned by ``exception()``),
as the blocking call would have raised it; the calls queued after a failed one fail
with the same kind of error without running.
"""
import abc
import math
import time
from typing import Any, Iterable, List, Optional

from shmcoll import _engine


class Work(abc.ABC):
    """The handle of one nonblocking collective (shmcoll.Communicator methods called
    with ``async_op=True``)."""

    @abc.abstractmethod
    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the call completed and return what the blocking call returns
        (the result array, None on non-roots...), or raise its error.  With `timeout`
        seconds, a call still running then raises shmcoll.TimeoutError and stays
        outstanding."""

    @abc.abstractmethod
    def is_completed(self) -> bool:
        """Whether the call completed, successfully or not; never blocks."""

    @abc.abstractmethod
    def exception(self) -> Optional[BaseException]:
        """The error the call failed with; None while it runs or when it succeeded."""


Work.register(_engine.Work)


class ConvertedWork(Work):
    """A Work whose result is handed back converted (to the caller's kind of array)."""

    def __init__(self, work: Work, convert):
        self._work, self._convert = work, convert

    def wait(self, timeout: Optional[float] = None) -> Any:
        return self._convert(self._work.wait(timeout))

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def exception(self) -> Optional[BaseException]:
        return self._work.exception()

    def __repr__(self) -> str:
        return repr(self._work)


def wait_all(works: Iterable[Work], timeout: Optional[float] = None) -> List[Any]:
    """Wait for every work (within `timeout` seconds in all) and return their results
    in order; the first failure is raised once every work has completed or failed."""
    works = list(works)
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    for w in works:
        left = None if timeout is None else max(0.0, deadline - time.monotonic())
        try:
            w.wait(left)
        except Exception:
            if not w.is_completed():    # the wait timed out, not the call
                raise
    return [w.wait() for w in works]
