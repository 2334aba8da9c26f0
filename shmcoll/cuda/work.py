"""The Work of a collective on device arrays: the call is enqueued on the caller's
current CUDA stream, so waiting for it is synchronising with an event recorded
right after it (and raising what a device-side wait recorded)."""
import time

from shmcoll.errors import TimeoutError
from shmcoll.work import Work

# How often wait(timeout) asks the device whether it passed the event.
_POLL_S = 50e-6


class DeviceWork(Work):
    def __init__(self, backend, event, result):
        self._backend, self._event, self._result = backend, event, result
        self._done, self._error = False, None

    def _finish(self):
        try:
            self._backend.check()
        except Exception as e:      # a device-side wait timed out: results invalid
            self._error, self._result = e, None
        self._done = True

    def wait(self, timeout=None):
        if not self._done:
            if timeout is None:
                self._event.synchronize()
            else:
                deadline = time.monotonic() + timeout
                while not self._event.query():
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"a device collective is still running after "
                                           f"wait(timeout={timeout!r}); it stays outstanding")
                    time.sleep(_POLL_S)
            self._finish()
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self):
        if not self._done and self._event.query():
            self._finish()
        return self._done

    def exception(self):
        return self._error if self.is_completed() else None

    def __repr__(self):
        state = "running" if not self._done else "done" if self._error is None else "failed"
        return f"<shmcoll.Work on the device: {state}>"
