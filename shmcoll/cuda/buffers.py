"""Each rank's IPC buffers and flags, and their exchange through the CPU engine.

Every rank allocates, with allocations of their own (an IPC handle names a whole
allocation, so never memory-pool blocks):
  data    2 x half bytes: `in` (this rank's input, read by peers) then `aux`
          (partial or finished blocks peers read in the second phase)
  flags   KINDS x world uint64 words, flags[kind][src], written by rank src
It exports both, the ranks exchange handles once with one allgather on the shared-
memory engine, and each opens its peers' (lazily enabling peer access; a peer on
the same GPU needs no peer access).  A second allgather tells every rank whether
every rank succeeded, so either all proceed or all raise DeviceError.  close()
closes the peers' handles and waits for every rank to have done so before freeing
its own: a buffer is never freed while a peer still has it open.
"""
import logging
import os
import struct

import numpy as np

from shmcoll.errors import DeviceError, ShmcollError

KINDS = 2           # flag words: 0 barrier, 1 ring/chain "ready"
BARRIER, READY = 0, 1
_RECORD = struct.Struct("64s64s64sQQ")     # data handle, flags handle, GPU identity, half, pid
_OK, _UNREACHABLE, _OPEN_FAILED = 0, 1, 2
_WHY = {_UNREACHABLE: "cannot reach its peers' GPU memory (no peer access between the GPUs)",
        _OPEN_FAILED: "could not open a peer's IPC handle"}
log = logging.getLogger("shmcoll")


class PeerBuffers:
    def __init__(self, engine, backend, half):
        self.engine, self.backend, self.half = engine, backend, half
        self.rank, self.world = engine.rank, engine.world_size
        self.data = [0] * self.world
        self.flags = [0] * self.world
        self.one_device = False     # every rank on the same GPU
        self._opened = []
        self.data[self.rank] = backend.malloc(2 * half)
        try:
            self.flags[self.rank] = backend.malloc(KINDS * self.world * 8)
            backend.memset(self.flags[self.rank], 0, KINDS * self.world * 8)
            self._exchange()
        except BaseException:
            self._release_own()
            raise
        self.data_table = backend.make_table(self.data)
        self.flag_table = backend.make_table(self.flags)

    def _exchange(self):
        b = self.backend
        mine = _RECORD.pack(b.ipc_handle(self.data[self.rank]), b.ipc_handle(self.flags[self.rank]),
                            b.identity(), self.half, os.getpid())
        records = self.engine.allgather(np.frombuffer(mine, dtype=np.uint8), None)
        status = _OK
        for peer in range(self.world):
            if peer == self.rank or status != _OK:
                continue
            data_h, flags_h, identity, half, _ = _RECORD.unpack(records[peer].tobytes())
            if half != self.half:
                status = _OPEN_FAILED
            elif not b.can_reach(identity.rstrip(b"\0")):
                status = _UNREACHABLE
            else:
                try:
                    self.data[peer] = self._open(data_h)
                    self.flags[peer] = self._open(flags_h)
                except ShmcollError:
                    status = _OPEN_FAILED
        identities = {_RECORD.unpack(records[r].tobytes())[2] for r in range(self.world)}
        self.one_device = len(identities) == 1
        verdict = self.engine.allgather(np.array([status], dtype=np.uint8), None)
        failed = [(r, int(s)) for r, s in enumerate(verdict.ravel()) if s != _OK]
        if failed:
            self._close_peers()
            raise DeviceError("CUDA IPC setup failed: " + "; ".join(
                f"rank {r} {_WHY[s]}" for r, s in failed))
        b.seal(self.data[self.rank])
        b.seal(self.flags[self.rank])

    def _open(self, handle):
        ptr = self.backend.ipc_open(handle)
        self._opened.append(ptr)
        return ptr

    def in_ptr(self, rank):
        return self.data[rank]

    def aux_ptr(self, rank):
        return self.data[rank] + self.half

    def _close_peers(self):
        for ptr in self._opened:
            self.backend.ipc_close(ptr)
        self._opened = []

    def _release_own(self):
        for ptr in (self.data[self.rank], self.flags[self.rank]):
            if ptr:
                self.backend.free(ptr)
        self.data[self.rank] = self.flags[self.rank] = 0

    def close(self, failed=False):
        """Close peers' handles, wait until every rank has closed ours, then free.
        When the job has failed (or the wait fails) our buffers are left to the
        process's exit rather than freed under a peer that may still read them."""
        self._close_peers()
        if not failed:
            try:
                self.engine.barrier()
            except ShmcollError as e:
                log.warning("shmcoll: device buffers of rank %d kept until exit: %s", self.rank, e)
                return
            self._release_own()
