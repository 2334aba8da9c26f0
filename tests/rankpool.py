"""A job of P live ranks that runs test functions on request, so that a test pays
for process start-up once per session instead of once per case."""
import multiprocessing as mp
import threading

import shmcoll


def _serve(comm, inboxes, outbox):
    inbox = inboxes[comm.rank]
    while True:
        task = inbox.get()
        if task is None:
            return None
        fn, args = task
        try:
            outbox.put((comm.rank, "ok", fn(comm, *args)))
        except BaseException as e:  # report, keep serving
            outbox.put((comm.rank, "error", f"{type(e).__name__}: {e}"))


class RankPool:
    def __init__(self, world, timeout=60):
        ctx = mp.get_context("spawn")
        self.world = world
        self._inboxes = [ctx.Queue() for _ in range(world)]
        self._outbox = ctx.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._thread.start()

    def _run(self, timeout):
        try:
            shmcoll.launch(_serve, self.world, args=(self._inboxes, self._outbox), timeout=timeout)
        except BaseException as e:
            self._error = e
            self._outbox.put((-1, "error", f"pool died: {e}"))

    def run(self, fn, *args, timeout=300):
        """Call fn(comm, *args) on every rank; return the results in rank order."""
        for q in self._inboxes:
            q.put((fn, args))
        results = {}
        for _ in range(self.world):
            rank, status, value = self._outbox.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank}: {value}")
            results[rank] = value
        return [results[r] for r in range(self.world)]

    def close(self):
        for q in self._inboxes:
            q.put(None)
        self._thread.join(60)
