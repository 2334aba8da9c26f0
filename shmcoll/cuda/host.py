"""A stand-in device for testing the GPU path on machines without one.

"Device" allocations are POSIX shared memory, IPC handles their names, kernels numpy
loops with the device kernels' semantics (float32 accumulation for float16/bfloat16,
wrapping integers, rank order), and HostArray exposes __cuda_array_interface__ over
host memory, as the tests of other CUDA-aware libraries do.  Waits are synchronous
and raise TimeoutError themselves.
"""
import ctypes
import mmap
import os
import secrets
import time

import numpy as np
import posix_ipc

from shmcoll.errors import DeviceError, TimeoutError
from shmcoll.ops import UFUNCS, accumulator_dtype, finish


class HostArray:
    """A numpy array presented as a device array (version 3 of the interface)."""

    def __init__(self, data):
        self.host = np.ascontiguousarray(data)
        self._interface = {"shape": self.host.shape, "typestr": self.host.dtype.str,
                           "strides": None, "data": (self.host.ctypes.data, False),
                           "version": 3, "stream": None}

    @property
    def shape(self):
        return self.host.shape

    @property
    def dtype(self):
        return self.host.dtype

    @property
    def size(self):
        return self.host.size

    @property
    def __cuda_array_interface__(self):
        return self._interface

    def get(self):
        return self.host.copy()

    def __getitem__(self, index):
        """A view (for contiguous selections, as perf's in-place cases use)."""
        return HostArray(self.host[index])

    def __setitem__(self, index, value):
        self.host[index] = value.host if isinstance(value, HostArray) else value


def _view(ptr, nbytes, dtype):
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)


class _PassedEvent:
    """The host stand-in runs every call before returning: its events are passed."""

    def query(self):
        return True

    def synchronize(self):
        pass


class HostBackend:
    name = "host"

    def __init__(self):
        self._maps = {}         # ptr -> (mmap, name, owned)
        # Seconds every copy and reduction waits before reading: tests make one rank
        # slow, so that a schedule reusing a buffer too early shows as a wrong result.
        self.read_delay = 0.0

    def identity(self):
        return f"host:{os.uname().nodename}".encode()

    def can_reach(self, identity):
        return identity == self.identity()

    def _map(self, name, size, create):
        flags = posix_ipc.O_CREX if create else 0
        shm = posix_ipc.SharedMemory(name, flags, mode=0o600, size=size if create else 0)
        try:
            mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        anchor = ctypes.c_char.from_buffer(mm)
        ptr = ctypes.addressof(anchor)
        del anchor
        self._maps[ptr] = (mm, name, create)
        return ptr

    def malloc(self, nbytes):
        return self._map(f"/shmcoll-dev-{os.getpid()}-{secrets.token_hex(8)}", nbytes, True)

    def memory_bytes(self):
        return 0                        # host memory stands in: the smallest default

    def free(self, ptr):
        mm, name, owned = self._maps.pop(ptr)
        mm.close()
        if owned:
            self.seal_name(name)

    @staticmethod
    def seal_name(name):
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass

    def seal(self, ptr):
        self.seal_name(self._maps[ptr][1])

    def memset(self, ptr, value, nbytes):
        ctypes.memset(ptr, value, nbytes)

    def ipc_handle(self, ptr):
        return self._maps[ptr][1].encode().ljust(64, b"\0")

    def ipc_open(self, handle):
        name = bytes(handle).rstrip(b"\0").decode()
        try:
            return self._map(name, 0, False)
        except posix_ipc.ExistentialError:
            raise DeviceError(f"cannot open peer buffer {name}: it no longer exists") from None

    def ipc_close(self, ptr):
        self.free(ptr)

    def make_table(self, ptrs):
        return [int(p) for p in ptrs]

    def stream(self):
        return None

    def copy(self, dst, src, nbytes, stream):
        if self.read_delay:
            time.sleep(self.read_delay)
        if nbytes:
            ctypes.memmove(dst, src, nbytes)

    def copy2d(self, dst, dpitch, src, spitch, width, height, stream):
        for row in range(height):
            self.copy(dst + row * dpitch, src + row * spitch, width, stream)

    @np.errstate(over="ignore", invalid="ignore")
    def reduce(self, out, table, nsrc, offset, count, dtype, op, world, stream):
        if self.read_delay:
            time.sleep(self.read_delay)
        size = count * dtype.itemsize
        acc_t = accumulator_dtype(dtype)
        acc = _view(table[0] + offset, size, dtype).astype(acc_t)
        for r in range(1, nsrc):
            acc = UFUNCS[op](acc, _view(table[r] + offset, size, dtype).astype(acc_t))
        _view(out, size, dtype)[:] = finish(acc, op, world).astype(dtype)

    @np.errstate(over="ignore", invalid="ignore")
    def combine(self, out, a, b, count, dtype, op, partial_is_acc, last, world, stream):
        if self.read_delay:
            time.sleep(self.read_delay)
        acc_t = accumulator_dtype(dtype)
        left = _view(a, count * (acc_t if partial_is_acc else dtype).itemsize,
                     acc_t if partial_is_acc else dtype).astype(acc_t)
        v = UFUNCS[op](left, _view(b, count * dtype.itemsize, dtype).astype(acc_t))
        if last:
            _view(out, count * dtype.itemsize, dtype)[:] = finish(v, op, world).astype(dtype)
        else:
            _view(out, count * acc_t.itemsize, acc_t)[:] = v

    def sync(self, flags, me, world, kind, peer, signal_value, wait_value, timeout, stream):
        peers = [t for t in range(world) if t != me and (peer < 0 or t == peer)]
        for t in peers if signal_value else ():
            ctypes.c_uint64.from_address(flags[t] + 8 * (kind * world + me)).value = signal_value
        deadline = time.monotonic() + timeout
        for t in peers if wait_value else ():
            word = ctypes.c_uint64.from_address(flags[me] + 8 * (kind * world + t))
            while word.value < wait_value:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"device wait for rank {t} timed out after {timeout:g} s")
                time.sleep(0)

    def check(self):
        pass

    def synchronize(self, stream):
        pass

    def record(self, stream):
        return _PassedEvent()

    def empty(self, shape, dtype):
        return HostArray(np.empty(shape, dtype))
