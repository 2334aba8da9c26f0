"""Nonblocking calls of shmcoll.mpi.Communicator: one thread per communicator runs its
calls in the order they were issued (as shmcoll.Communicator's progress thread does),
so a call with ``async_op=True`` returns a shmcoll.Work at once.

A blocking call issued while nonblocking ones are outstanding joins the queue and
waits for its turn; with none outstanding it runs on the caller's thread.  MPI is
then called from two threads, one at a time, which needs MPI_THREAD_SERIALIZED or
more (mpi4py asks for MPI_THREAD_MULTIPLE by default).  After a call fails, the
calls queued behind it fail with CommunicatorBrokenError without running (their
peers cannot be in step any more), and every other rank learns of it (mpi.faults).
"""
import concurrent.futures
import threading
from typing import Any, Optional

from shmcoll.errors import CommunicatorBrokenError, ShmcollError, TimeoutError
from shmcoll.work import Work


class CallWork(Work):
    """A call queued on the communicator's thread."""

    def __init__(self, future: concurrent.futures.Future, what: str) -> None:
        self._future, self._what = future, what

    def wait(self, timeout: Optional[float] = None) -> Any:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self._what} still running after {timeout} s") from None

    def is_completed(self) -> bool:
        return self._future.done()

    def exception(self) -> Optional[BaseException]:
        return self._future.exception(0) if self._future.done() else None

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "running"
        return f"<shmcoll.mpi Work {self._what}: {state}>"


class Calls:
    """The queue of one communicator's calls (see the module's docstring)."""

    def __init__(self, name: str, mpi_module, check_peers, on_failure) -> None:
        self._name, self._MPI = name, mpi_module
        self._check_peers, self._on_failure = check_peers, on_failure
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pending = 0
        self._lock = threading.Lock()
        self._failure: Optional[BaseException] = None

    def run(self, what: str, call, async_op: bool):
        """call() now on this thread, or after the outstanding calls; async_op: a Work."""
        if not async_op and not self._pending:
            self._raise_if_failed(what)
            return self._guarded(call)
        work = CallWork(self._submit(what, call), what)
        return work if async_op else work.wait()

    def _submit(self, what, call):
        if self._pool is None:
            if self._MPI.Query_thread() < self._MPI.THREAD_SERIALIZED:
                raise RuntimeError("async_op needs MPI initialised with MPI_THREAD_SERIALIZED "
                                   "or more (mpi4py.rc.thread_level)")
            self._pool = concurrent.futures.ThreadPoolExecutor(1, f"shmcoll-mpi-{self._name}")
        with self._lock:
            self._pending += 1

        def turn():
            try:
                self._raise_if_failed(what)
                return self._guarded(call)
            finally:
                with self._lock:
                    self._pending -= 1
        return self._pool.submit(turn)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def _guarded(self, call):
        """call(), after checking no other rank failed; a failure is told to them."""
        try:
            self._check_peers()
            return call()
        except ShmcollError as e:
            if self._failure is None:
                self._failure = e
                self._on_failure(e)
            raise

    def _raise_if_failed(self, what):
        if self._failure is not None:
            raise CommunicatorBrokenError(
                f"{what}: an earlier call failed ({type(self._failure).__name__}: "
                f"{self._failure}); this communicator cannot be used again")

    def drain(self) -> None:
        """Wait for every queued call (their errors stay with their Works)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
