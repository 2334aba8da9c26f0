"""Symmetric allocations: arrays that live in the job's shared memory, the same
allocation on every rank (Communicator.empty / zeros).

One allocation is one shared segment of P slices, one per rank, that every rank maps
whole; rank r's array is at the start of slice r.  A collective whose x is such an
array (or a view inside it, at the same place on every rank) runs the single-copy
schedules (tuning.algorithms.symmetric, csrc/sc_single_copy.c): peers read it where it
lies instead of receiving a copy through the channel slots.

Allocating is collective: every rank calls with the same shape and dtype, in the same
order as its other calls.  The segment follows the job's rules (shmcoll._core.segment):
an unguessable name of this user, mode 0600, O_EXCL, unlinked as soon as every rank
has it mapped, so the kernel frees it once the last mapping is gone.  Each rank backs
its own slice with memory (on its NUMA node), so a full /dev/shm is an error on every
rank instead of SIGBUS.  A rank's mapping lives as long as an array of it (the engine
forgets the allocation just before); there is no cap other than /dev/shm.
"""
import errno
import math
import mmap
import os
import stat
import zlib

import numpy as np
import posix_ipc

from shmcoll._core import segment
from shmcoll.errors import SegmentError, SharedMemoryFullError

_PAGE = mmap.PAGESIZE
_NAME_BYTES = 104           # room for the segment's name in the header rank 0 broadcasts

# What a rank reports after trying to map its slice.
_OK, _NO_SPACE, _FAILED = 0, 1, 2


def _round_up(n, to):
    return (n + to - 1) // to * to


def _request(shape, dtype):
    """(shape tuple, numpy dtype, bytes) of a request, checked."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be an integer or a sequence of integers, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"shape must not have negative dimensions, got {shape}")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects: it cannot live in shared memory")
    return shape, dt, math.prod(shape) * dt.itemsize


def _fingerprint(shape, dt, nbytes):
    """What every rank must have asked for, as three integers."""
    return [nbytes, zlib.crc32(dt.str.encode()), zlib.crc32(repr(shape).encode())]


class Allocation:
    """One symmetric allocation as this rank maps it."""

    def __init__(self, number, mapping, stride, world):
        self.number, self.mapping, self.stride, self.world = number, mapping, stride, world
        self.base = np.frombuffer(mapping, np.uint8).ctypes.data

    def array(self, rank, shape, dt):
        return np.ndarray(shape, dt, buffer=self.mapping, offset=rank * self.stride)


def allocate(comm, shape, dtype, number):
    """The array of this rank in a new symmetric allocation (collective; see module)."""
    shape, dt, nbytes = _request(shape, dtype)
    engine, rank, world = comm._engine, comm.rank, comm.world_size
    stride = _round_up(max(nbytes, 1), _PAGE)
    asked = np.array(_fingerprint(shape, dt, nbytes), np.int64)
    everyone = engine.allgather(asked, None, None, False)
    differ = [r for r in range(world) if not np.array_equal(everyone[r], everyone[0])]
    if differ:
        raise ValueError(f"Communicator.empty on rank {rank}: ranks asked for different arrays "
                         f"(rank 0: {_describe(everyone[0])}; rank {differ[0]}: "
                         f"{_describe(everyone[differ[0]])}); every rank must pass the same "
                         f"shape and dtype")
    header = np.zeros(2 + _NAME_BYTES // 8, np.int64)
    name = None
    if rank == 0:
        name, header[0] = _create(stride * world)
        if name is not None:
            encoded = name.encode()
            header[1] = len(encoded)
            header.view(np.uint8)[16:16 + len(encoded)] = np.frombuffer(encoded, np.uint8)
    try:
        engine.broadcast(header, 0, None, False)
        if header[0]:
            raise _error(int(header[0]), 0, stride * world)
        if name is None:
            name = header.view(np.uint8)[16:16 + int(header[1])].tobytes().decode()
        mapping, status = _map(name, rank, stride, world)
        statuses = engine.allgather(np.array([status], np.int64), None, None, False).ravel()
    finally:
        if rank == 0 and name is not None:
            segment.unlink(name)        # every rank has it mapped (or gave up) by now
    failed = [r for r in range(world) if statuses[r] != _OK]
    if failed:
        if mapping is not None:
            mapping.close()
        raise _error(int(statuses[failed[0]]), failed[0], stride)
    return Allocation(number, mapping, stride, world), shape, dt


def _describe(fingerprint):
    return f"{int(fingerprint[0])} bytes, dtype/shape fingerprint {int(fingerprint[1]):08x}/" \
           f"{int(fingerprint[2]):08x}"


def _create(size):
    """Rank 0: a new segment of `size` bytes; (name, _OK) or (None, why)."""
    name, _ = segment.launch_identity()
    try:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=max(size, _PAGE))
    except (posix_ipc.Error, OSError) as e:
        return None, _NO_SPACE if getattr(e, "errno", None) == errno.ENOSPC else _FAILED
    shm.close_fd()
    return name, _OK


def _map(name, rank, stride, world):
    """Open the segment (only this user's private file of the expected size), back this
    rank's slice with memory and map it whole: (mapping or None, status)."""
    size = max(stride * world, _PAGE)
    try:
        fd = os.open("/dev/shm" + name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, _FAILED
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 \
                or st.st_size != size:
            return None, _FAILED
        try:
            os.posix_fallocate(fd, rank * stride, stride)
        except OSError as e:
            return None, _NO_SPACE if e.errno == errno.ENOSPC else _FAILED
        return mmap.mmap(fd, size), _OK
    except OSError:
        return None, _FAILED
    finally:
        os.close(fd)


def _error(status, rank, size):
    if status == _NO_SPACE:
        return SharedMemoryFullError(
            f"/dev/shm is too full for a symmetric allocation: rank {rank} could not back "
            f"its {size} bytes (shmcoll cleanup removes entries of dead jobs)")
    return SegmentError(f"a symmetric allocation failed on rank {rank}: its shared segment "
                        f"could not be created, opened or mapped")
