"""The torch Work a shmcoll process group returns, over shmcoll's nonblocking calls.

A torch call may be served by one shmcoll call or several (coalesced lists), plus a
last step on the caller's side of the engine: copying results into tensors the
engine could not write directly (non-contiguous tensors, lists of tensors).  That
step runs exactly once, in whichever thread first sees the calls complete.

``get_future()`` is what DDP and communication hooks wait on, from C++ and without
calling back into this object; so a future is completed by a thread of its own (two
per group, one for collectives and one for sends and receives, as shmcoll keeps the
two kinds apart; each started at its first future still pending), which waits for
the calls of its kind in the order they were issued (the order collectives complete
in; a send or receive may complete sooner, and its future is set in its turn) and
then sets the result, or a real error (see _outcome).
"""
import atexit
import collections
import datetime
import threading
import weakref

import torch
import torch.distributed as dist


def _seconds(timeout):
    """Work.wait's timeout (a timedelta or seconds; zero means none) in seconds."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return None if not timeout or timeout <= 0 else float(timeout)


class TorchWork(dist.Work):
    """One torch collective on a shmcoll group: `pending` (shmcoll Works, none when it
    ran blocking) then `finish` (no arguments; None when there is nothing to do)."""

    def __init__(self, group, name, outputs, pending=(), finish=None):
        super().__init__()
        self._group, self._name, self._outputs = group, name, outputs
        self._pending, self._finish = list(pending), finish
        # which of the group's completion threads sets its future: a send, a receive,
        # or a coalesced batch of them (batch_isend_irecv) goes with the messages
        self._messages = name in ("send", "recv") or bool(self._pending) and all(
            isinstance(w, TorchWork) and w._messages for w in self._pending)
        self._done = not self._pending and finish is None
        self._error = None
        self._future = None
        self._lock = threading.Lock()
        if not self._pending and not self._done:
            self._complete(None)

    # -- completion ----------------------------------------------------------
    def _complete(self, timeout):
        """Wait for the shmcoll calls (timeout: seconds or None) and run the last step
        once; a call's failure becomes this work's error.  A wait cut short (a timeout,
        Ctrl-C) raises and leaves the work pending."""
        error = None
        for w in self._pending:
            try:
                w.wait(timeout)
            except BaseException as e:  # noqa: BLE001 - judged below
                if not w.is_completed():
                    raise               # still running: not this work's outcome
                if error is None:
                    error = e
        with self._lock:
            if self._done:
                return
            if error is None and self._finish is not None:
                try:
                    self._finish()
                except Exception as e:  # noqa: BLE001 - the work's error, raised by wait
                    error = e
            self._error, self._done = error, True
            self._pending, self._finish = [], None

    def _publish(self):
        """Hand the outcome to the future (on the completion thread or at get_future)."""
        self._settled.set_result(None)

    def _outcome(self, _):
        """The future's value, or (raised here) its error: a future that C++ waits on
        (DDP) must hold a real error, and Future.set_exception stores the exception as
        the future's value instead, which DDP would read as a result."""
        if self._error is not None:
            raise self._error
        return self._outputs

    # -- torch's Work --------------------------------------------------------
    def wait(self, timeout=datetime.timedelta(0)):
        if not self._done:
            self._complete(_seconds(timeout))
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if self._done:
            return True
        if all(w.is_completed() for w in self._pending):
            self._complete(None)
        return self._done

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error if self.is_completed() else None

    def result(self):
        self.wait()
        return self._outputs

    def source_rank(self):
        raise RuntimeError(f"shmcoll backend: {self._name} has no source rank (only a "
                           f"receive from any source has one)")

    def synchronize(self):
        self.wait()

    def get_future(self):
        if self._future is None:
            self._settled = torch.futures.Future()
            self._future = self._settled.then(self._outcome)
            if self.is_completed():
                self._publish()
            else:
                self._group._completions[self._messages].add(self)
        return self._future

    def __repr__(self):
        state = ("running" if not self._done else
                 "done" if self._error is None else f"failed ({type(self._error).__name__})")
        return f"<shmcoll.torch.TorchWork {self._name}: {state}>"


class Completions:
    """The thread that completes a group's pending futures of one kind (collectives,
    or sends and receives), in issue order."""

    def __init__(self, group_name):
        self._name = f"shmcoll-torch-futures ({group_name})"
        self._queue = collections.deque()
        self._ready = threading.Condition()
        self._thread = None
        self._stopping = False
        _LIVE.add(self)

    def add(self, work):
        with self._ready:
            if self._stopping:
                raise RuntimeError("shmcoll backend: the process group was shut down")
            self._queue.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._ready.notify()

    def _run(self):
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                work = self._queue.popleft()
            try:
                work._complete(None)
            except BaseException as e:  # noqa: BLE001 - the future reports it
                work._error, work._done = e, True
            work._publish()

    def stop(self):
        """Complete what is queued, then end the thread."""
        with self._ready:
            self._stopping = True
            thread, self._thread = self._thread, None
            self._ready.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()


# Every group's completion thread, ended at exit before the interpreter finalises: a
# daemon thread still inside torch's future callbacks then (a DDP job whose peer
# died, never destroyed) would meet torch's C++ objects being torn down.
_LIVE = weakref.WeakSet()


@atexit.register
def _stop_all():
    for completions in list(_LIVE):
        try:
            completions.stop()
        except BaseException:   # (at exit: nothing left to report to)
            pass
