"""The real device backend: CUDA IPC and kernels through CuPy (imported only here)."""
import ctypes

import numpy as np

from shmcoll.cuda import kernels
from shmcoll.errors import DeviceError, TimeoutError

_IPC_LAZY_ENABLE_PEER_ACCESS = 1        # cudaIpcMemLazyEnablePeerAccess
_HOST_ALLOC_MAPPED = 2                  # cudaHostAllocMapped
_MEMCPY_DEFAULT = 4                     # cudaMemcpyDefault: unified addressing decides
_MULTIPROCESSOR_COUNT = 16            # cudaDevAttrMultiProcessorCount
_THREADS = 256
_OPTIONS = ("--std=c++14",)


class CupyBackend:
    name = "cupy"

    def __init__(self):
        try:
            import cupy
        except ImportError:
            raise DeviceError("device arrays need CuPy: pip install 'shmcoll[cuda]' "
                              "(or the cupy-cudaXXx wheel matching your CUDA)") from None
        self.cp = cupy
        self.rt = cupy.cuda.runtime
        try:
            self.device = self.rt.getDevice()
            self._sms = self.rt.deviceGetAttribute(_MULTIPROCESSOR_COUNT, self.device)
            self._pci = self.rt.deviceGetPCIBusId(self.device)
        except Exception as e:  # CUDA driver or device missing
            raise DeviceError(f"no usable CUDA device: {e}") from None
        self._modules = {}          # (dtype name, op) -> RawModule
        self._functions = {}        # (dtype, op, which) -> RawKernel
        self._sync = cupy.RawModule(code=kernels.source(), options=_OPTIONS).get_function(kernels.SYNC)
        # The wait kernel reports a timeout here: pinned, mapped host memory, which the
        # device addresses with the host pointer (unified addressing).
        self._status = self.rt.hostAlloc(8, _HOST_ALLOC_MAPPED)
        ctypes.memset(self._status, 0, 8)

    def identity(self):
        return self._pci.encode()

    def can_reach(self, identity):
        if identity == self.identity():
            return True                 # the same GPU: no peer access involved
        try:
            peer = self.rt.deviceGetByPCIBusId(identity.decode())
        except Exception:
            return False                # not visible to this process
        return bool(self.rt.deviceCanAccessPeer(self.device, peer))

    def malloc(self, nbytes):
        return self.rt.malloc(nbytes)

    def free(self, ptr):
        self.rt.free(ptr)

    def memory_bytes(self):
        return int(self.rt.memGetInfo()[1])

    def seal(self, ptr):
        pass

    def memset(self, ptr, value, nbytes):
        self.rt.memset(ptr, value, nbytes)

    def ipc_handle(self, ptr):
        return bytes(self.rt.ipcGetMemHandle(ptr))

    def ipc_open(self, handle):
        try:
            return self.rt.ipcOpenMemHandle(bytes(handle), _IPC_LAZY_ENABLE_PEER_ACCESS)
        except Exception as e:
            raise DeviceError(f"cannot open a peer's CUDA IPC handle: {e}") from None

    def ipc_close(self, ptr):
        self.rt.ipcCloseMemHandle(ptr)

    def make_table(self, ptrs):
        return self.cp.asarray(np.asarray(ptrs, dtype=np.uint64))

    def stream(self):
        return self.cp.cuda.get_current_stream()

    def copy(self, dst, src, nbytes, stream):
        if nbytes:
            self.rt.memcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, stream.ptr)

    def copy2d(self, dst, dpitch, src, spitch, width, height, stream):
        if width and height:
            self.rt.memcpy2DAsync(dst, dpitch, src, spitch, width, height, _MEMCPY_DEFAULT,
                                  stream.ptr)

    def _function(self, dtype, op, which):
        """The kernel `which` ('reduce', or (partial_is_acc, last) for a ring step) of
        (dtype, op); compiled at first use, one module per (dtype, op)."""
        key = (dtype, op, which)
        fn = self._functions.get(key)
        if fn is None:
            name = dtype.name
            if (name, op) not in self._modules:
                self._modules[name, op] = self.cp.RawModule(
                    code=kernels.source(), options=_OPTIONS,
                    name_expressions=kernels.names_for(name, op))
            expr = kernels.reduce_name(name, op) if which == "reduce" else \
                kernels.combine_name(name, op, *which)
            fn = self._functions[key] = self._modules[name, op].get_function(expr)
        return fn

    def _grid(self, count):
        return (max(1, min(-(-count // _THREADS), 8 * self._sms)),)

    def reduce(self, out, table, nsrc, offset, count, dtype, op, world, stream):
        if count:
            fn = self._function(dtype, op, "reduce")
            fn(self._grid(count), (_THREADS,), (np.uint64(out), table, np.int32(nsrc),
               np.uint64(offset), np.uint64(count), np.int32(world)), stream=stream)

    def combine(self, out, a, b, count, dtype, op, partial_is_acc, last, world, stream):
        if count:
            fn = self._function(dtype, op, (partial_is_acc, last))
            fn(self._grid(count), (_THREADS,), (np.uint64(out), np.uint64(a), np.uint64(b),
               np.uint64(count), np.int32(world)), stream=stream)

    def sync(self, flags, me, world, kind, peer, signal_value, wait_value, timeout, stream):
        threads = -(-world // 32) * 32
        self._sync((1,), (threads,), (flags, np.int32(me), np.int32(world), np.int32(kind),
                   np.int32(peer), np.uint64(signal_value), np.uint64(wait_value),
                   np.uint64(_timeout_ns(timeout)), np.uint64(self._status)), stream=stream)

    def check(self):
        peer = ctypes.c_int.from_address(self._status).value
        if peer:
            raise TimeoutError(f"a device-side wait for rank {peer - 1} timed out (the results "
                               f"of the collectives since the last check are not valid)")

    def synchronize(self, stream):
        stream.synchronize()
        self.check()

    def record(self, stream):
        event = self.cp.cuda.Event(block=True, disable_timing=True)
        event.record(stream)
        return event

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)


# About 146 years: a longer timeout (infinity included) never expires, and the
# kernel's start + timeout cannot wrap around 64 bits.
_NO_DEADLINE_NS = 1 << 62


def _timeout_ns(timeout):
    return _NO_DEADLINE_NS if timeout * 1e9 >= _NO_DEADLINE_NS else int(timeout * 1e9)
