# Included by _engine.pyx: the handle of a nonblocking call on the CPU engine.

# Engines with nonblocking calls not settled yet: reachable from here, an engine and
# the Works that own the C records and buffers its progress thread writes are never
# collected as garbage under that thread.
_BUSY = set()


cdef class Work:
    """A collective issued with ``async_op=True`` on numpy arrays (shmcoll.Work).

    It runs on one of the communicator's two progress threads: a collective after the
    collectives issued before it; a send or receive on the other thread, with the
    sends and receives queued right before it, and it completes as soon as its own
    message has moved.
    Until it completed, the caller must not write its input or read or write ``out``
    (or x of broadcast): the thread reads and writes them meanwhile.
    """
    cdef sc_work w              # what the progress thread runs and writes back
    cdef sc_p2p_op ops[2]       # a point-to-point work's operations (w.ops)
    cdef Engine engine          # until settled
    cdef object keep            # the input buffer, until settled
    cdef object result          # what wait() returns
    cdef object error           # what wait() raises
    cdef bint settled

    cdef void _settle(self, object error):
        if self.settled:        # a p2p work settles when it completes, ahead of its turn
            return
        self.error, self.settled = error, True
        self.engine = self.keep = None
        if error is not None:
            self.result = None

    @property
    def collective(self):
        """The collective's name ("allreduce", "barrier", ...)."""
        return _work_name(&self.w)

    def wait(self, timeout=None):
        """Block (GIL released) until the call completed and return what the blocking
        call returns; raise what it would have raised.  With `timeout` seconds, a call
        still running then raises shmcoll.TimeoutError and stays outstanding."""
        cdef double limit = INFINITY
        cdef Engine engine = self.engine
        if not self.settled:
            if timeout is not None:
                limit = timeout
                if not limit >= 0:
                    raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
            if not engine._await_work(self, limit) and not self.settled:
                raise ShmTimeoutError(
                    f"{self.collective} on rank {engine.rank} is still running after "
                    f"wait(timeout={timeout!r}); it stays outstanding (wait again)", [])
        if self.error is not None:
            raise self.error
        return self.result

    def is_completed(self):
        """Whether the call has completed, successfully or not (never blocks)."""
        if not self.settled:
            self.engine._resolve()
            if not self.settled:
                self.engine._settle_finished(self)
        return self.settled

    def exception(self):
        """The exception the call failed with; None while it runs or if it succeeded
        (never blocks)."""
        return self.error if self.is_completed() else None

    def __repr__(self):
        state = ("running" if not self.settled else
                 "done" if self.error is None else f"failed ({type(self.error).__name__})")
        return f"<shmcoll.Work {self.collective} #{self.w.ticket}: {state}>"
