"""Telling every rank of the job that one failed.

Inside a node, the shared-memory engine already makes every rank waiting for a dead
or failed peer raise PeerLostError.  Across nodes MPI does not: a rank waiting in an
MPI phase for a peer that died (or that raised and left the call) would wait for its
timeout, or until the launcher kills the job.  So a rank whose call fails sends a
short notice to every rank on a communicator of its own (a Dup of the MPI one), where
every rank keeps a receive posted; a rank completing an MPI phase tests that receive
too (mpi.waiting) and raises PeerLostError naming the failed rank.  A rank that
raises this way fails its node's job as well, so its local peers waiting in a node
phase raise at once: the failure reaches every rank of every node.
"""
from typing import Any, List, Optional

import numpy as np

from shmcoll.errors import PeerLostError

NOTICE_BYTES = 256
TAG = 0


class FaultNotices:
    """The notices of one hierarchical communicator (see the module's docstring)."""

    def __init__(self, mpi_comm: Any) -> None:
        from mpi4py import MPI
        self._MPI = MPI
        self._comm = mpi_comm.Dup()
        self._rank = self._comm.Get_rank()
        self._inbox = np.zeros(NOTICE_BYTES, np.uint8)
        self._incoming = self._comm.Irecv(self._inbox, source=MPI.ANY_SOURCE, tag=TAG)
        self._status = MPI.Status()
        self._outgoing: List[Any] = []
        self._sent = False
        self.received: Optional[PeerLostError] = None

    def check(self) -> None:
        """Raise PeerLostError if another rank's notice has arrived."""
        if self.received is None:
            if not self._incoming.Test(self._status):
                return
            text = bytes(self._inbox).rstrip(b"\0").decode("utf-8", "replace")
            source = self._status.Get_source()
            self.received = PeerLostError(
                f"rank {source} failed ({text}); this rank was waiting for an MPI phase",
                rank=source)
        raise self.received

    def tell(self, error: BaseException) -> None:
        """Send `error` to every other rank, once (nonblocking: a dead rank's send may
        never complete, and nothing waits for it)."""
        if self._sent or self.received is not None:
            return                      # the failure came from elsewhere: they know
        self._sent = True
        text = f"{type(error).__name__}: {error}".encode("utf-8")[:NOTICE_BYTES - 1]
        notice = np.zeros(NOTICE_BYTES, np.uint8)
        notice[:len(text)] = np.frombuffer(text, np.uint8)
        for peer in range(self._comm.Get_size()):
            if peer != self._rank:
                try:
                    self._outgoing.append(self._comm.Isend(notice, peer, tag=TAG))
                except self._MPI.Exception:
                    pass                # that peer's process is gone
        self._notice = notice           # the buffer lives as long as its sends

    def close(self) -> None:
        """Retire the posted receive with an empty notice to this rank itself (MPI
        libraries do not all release a cancelled receive cleanly) and free the
        communicator; after a failure, sends that may never complete are left to MPI."""
        if self._comm is None:
            return
        if not self._sent and self.received is None:
            empty = np.zeros(1, np.uint8)
            own = self._comm.Isend(empty, self._rank, tag=TAG)
            status = self._MPI.Status()
            self._incoming.Wait(status)
            if status.Get_source() != self._rank:     # a notice came first after all
                self._comm.Recv(self._inbox, self._rank, tag=TAG)
            own.Wait()
            self._comm.Free()
        self._comm = None
