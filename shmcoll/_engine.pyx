# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The one place where Python meets the C engine.

Each collective resolves its buffers once (numpy C-API, no Python per chunk), drops
the GIL for a single C call, and turns the C status into an exception here.
"""
from libc.stdint cimport uint64_t, uintptr_t
cimport numpy as cnp
import numpy as np

from shmcoll.errors import (PeerLostError, JobAbortedError, SegmentError,
                            CommunicatorBrokenError, TimeoutError as ShmTimeoutError)

cnp.import_array()

cdef extern from "csrc/shmcoll.h" nogil:
    ctypedef struct sc_comm:
        pass
    ctypedef struct sc_params:
        double timeout_s
        uint64_t spin_ns
        uint64_t yield_ns
        uint64_t slot_bytes
        unsigned int nslots
    enum:
        SC_OK, SC_ETIMEDOUT, SC_EPEERLOST, SC_EABORTED, SC_EINVAL, SC_ELAYOUT,
        SC_ERANKTAKEN, SC_EBROKEN
    enum:
        SC_INT8, SC_UINT8, SC_INT16, SC_UINT16, SC_INT32, SC_UINT32, SC_INT64,
        SC_UINT64, SC_FLOAT16, SC_BFLOAT16, SC_FLOAT32, SC_FLOAT64, SC_NDTYPES
    size_t sc_segment_size(int world, const sc_params *p)
    void *sc_map(int fd, size_t size, int *err)
    void sc_unmap(void *base, size_t size)
    int sc_format(void *base, size_t size, int world, const sc_params *p, uint64_t token, int pid)
    int sc_segment_world(const void *base, size_t size)
    int sc_segment_creator(const void *base, size_t size)
    sc_comm *sc_attach(void *base, size_t size, int rank, int world, uint64_t token,
                       const sc_params *wait, int *status, int *last)
    int sc_wait_attached(sc_comm *c)
    void sc_detach(sc_comm *c, int failed)
    void sc_abort(sc_comm *c)
    void sc_segment_abort(void *base, size_t size)
    int sc_barrier(sc_comm *c)
    int sc_allreduce(sc_comm *c, const void *x, void *out, size_t count, int dtype, int op)
    int sc_reduce_scatter(sc_comm *c, const void *x, void *out, size_t count, int dtype, int op)
    int sc_allgather(sc_comm *c, const void *x, void *out, size_t nbytes)
    int sc_error_peer(const sc_comm *c)
    const char *sc_error_what(const sc_comm *c)
    int sc_op_supported(int dtype, int op)


cdef dict _CODE_BY_NUM = {}
_NAMES = {}


def _register_dtypes():
    for name, code in (("int8", SC_INT8), ("uint8", SC_UINT8), ("int16", SC_INT16),
                       ("uint16", SC_UINT16), ("int32", SC_INT32), ("uint32", SC_UINT32),
                       ("int64", SC_INT64), ("uint64", SC_UINT64), ("float16", SC_FLOAT16),
                       ("float32", SC_FLOAT32), ("float64", SC_FLOAT64)):
        _CODE_BY_NUM[np.dtype(name).num] = code
        _NAMES[code] = name
    try:
        import ml_dtypes
    except ImportError:
        return
    _CODE_BY_NUM[np.dtype(ml_dtypes.bfloat16).num] = SC_BFLOAT16
    _NAMES[SC_BFLOAT16] = "bfloat16"


_register_dtypes()
SUPPORTED_DTYPES = tuple(sorted(_NAMES.values()))


cdef int dtype_code(cnp.ndarray a) except -1:
    code = _CODE_BY_NUM.get(cnp.PyArray_TYPE(a))
    if code is None or not cnp.PyArray_ISNOTSWAPPED(a):
        raise TypeError(f"unsupported dtype {a.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return code


def op_supported(int dtype_code, int op):
    return bool(sc_op_supported(dtype_code, op))


cdef cnp.ndarray as_input(object x):
    """Inputs are read only, so a non-contiguous or non-array input is copied."""
    if not cnp.PyArray_Check(x):
        x = np.asarray(x)
    if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
        x = np.ascontiguousarray(x)
    return <cnp.ndarray>x


cdef cnp.ndarray check_out(object out, tuple shape, object dtype):
    """`out` receives the result, so it is never silently replaced by a copy."""
    if not cnp.PyArray_Check(out):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    cdef cnp.ndarray o = <cnp.ndarray>out
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(o):
        raise ValueError("out must be C-contiguous (results cannot be written through a copy)")
    if not cnp.PyArray_ISWRITEABLE(o):
        raise ValueError("out is read-only")
    return o


cdef int check_no_partial_overlap(cnp.ndarray o, cnp.ndarray x) except -1:
    cdef uintptr_t ob = <uintptr_t>cnp.PyArray_DATA(o), xb = <uintptr_t>cnp.PyArray_DATA(x)
    cdef uintptr_t oe = ob + <uintptr_t>cnp.PyArray_NBYTES(o), xe = xb + <uintptr_t>cnp.PyArray_NBYTES(x)
    if ob != xb and ob < xe and xb < oe:
        raise ValueError("out partially overlaps x; pass out=x for in place, or a separate array")
    return 0


cdef class Segment:
    """A mapping of one shared segment (the name is managed by shmcoll.segment)."""
    cdef void *base
    cdef readonly size_t size

    def __cinit__(self, int fd, size_t size):
        cdef int err = 0
        self.base = sc_map(fd, size, &err)
        if self.base == NULL:
            raise SegmentError(f"cannot map the shared segment: {_strerror(err)}")
        self.size = size

    def format(self, int world, params, uint64_t token, int pid):
        cdef sc_params p = _params(params)
        if sc_format(self.base, self.size, world, &p, token, pid) != SC_OK:
            raise ValueError(f"invalid segment parameters {params} for world size {world}")

    def world(self):
        return sc_segment_world(self.base, self.size)

    def creator(self):
        return sc_segment_creator(self.base, self.size)

    def abort(self):
        sc_segment_abort(self.base, self.size)

    def __dealloc__(self):
        sc_unmap(self.base, self.size)
        self.base = NULL


def segment_size(int world, params):
    cdef sc_params p = _params(params)
    return sc_segment_size(world, &p)


cdef sc_params _params(object params) except *:
    cdef sc_params p
    p.timeout_s = params.timeout
    p.spin_ns = <uint64_t>(params.spin_us * 1000)
    p.yield_ns = <uint64_t>(params.yield_us * 1000)
    p.slot_bytes = params.slot_bytes
    p.nslots = params.nslots
    return p


def _strerror(int err):
    import os
    return os.strerror(err) if err else "not a shmcoll segment"


cdef class Engine:
    """One rank's attachment to a segment; owns no name, only the mapping's use."""
    cdef sc_comm *c
    cdef Segment seg
    cdef readonly int rank, world_size
    cdef readonly bint completed_attach

    def __cinit__(self, Segment seg, int rank, int world, uint64_t token, params):
        cdef int status = 0, last = 0
        cdef sc_params p = _params(params)
        self.seg = seg
        self.c = sc_attach(seg.base, seg.size, rank, world, token, &p, &status, &last)
        if self.c == NULL:
            if status == SC_ERANKTAKEN:
                raise SegmentError(f"rank {rank} is already taken by another process of this job")
            if status == SC_EINVAL:
                raise SegmentError(f"job was created for world size {seg.world()}, "
                                   f"not {world} (rank {rank})")
            raise SegmentError("the shared segment is not a shmcoll segment of this job and version")
        self.rank = rank
        self.world_size = world
        self.completed_attach = last

    cdef int _raise(self, int status, str what) except -1:
        peer = sc_error_peer(self.c)
        where = sc_error_what(self.c).decode()
        who = f" rank {peer}" if peer >= 0 else ""
        if status == SC_ETIMEDOUT:
            raise ShmTimeoutError(f"{what} on rank {self.rank} timed out {where}{who}")
        if status == SC_EPEERLOST:
            raise PeerLostError(f"{what} on rank {self.rank}: peer{who} died or closed its "
                                f"communicator ({where})", peer)
        if status == SC_EABORTED:
            raise JobAbortedError(f"{what} on rank {self.rank}: another rank failed and "
                                  f"aborted the job ({where}{who})")
        if status == SC_EBROKEN:
            raise CommunicatorBrokenError(
                f"{what}: an earlier collective failed on this communicator; it is unusable")
        raise ValueError(f"{what}: invalid arguments (status {status})")

    cdef inline void _live(self) except *:
        if self.c == NULL:
            from shmcoll.errors import ClosedError
            raise ClosedError("the communicator is closed")

    def wait_attached(self):
        self._live()
        cdef int st
        with nogil:
            st = sc_wait_attached(self.c)
        if st:
            self._raise(st, "joining the job")

    def barrier(self):
        self._live()
        cdef int st
        with nogil:
            st = sc_barrier(self.c)
        if st:
            self._raise(st, "barrier")

    def allreduce(self, x, out, int op):
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        cdef int dt = dtype_code(xa)
        _check_op(dt, op, xa)
        cdef cnp.ndarray oa
        if out is None:
            oa = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(xa), cnp.PyArray_DIMS(xa),
                                   cnp.PyArray_TYPE(xa), 0)
        else:
            oa = check_out(out, (<object>xa).shape, (<object>xa).dtype)
            check_no_partial_overlap(oa, xa)
        cdef size_t n = <size_t>cnp.PyArray_SIZE(xa)
        cdef const void *xp = cnp.PyArray_DATA(xa)
        cdef void *op_ = cnp.PyArray_DATA(oa)
        cdef int st
        with nogil:
            st = sc_allreduce(self.c, xp, op_, n, dt, op)
        if st:
            self._raise(st, "allreduce")
        return oa

    def reduce_scatter(self, x, out, int op):
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        cdef int dt = dtype_code(xa)
        _check_op(dt, op, xa)
        xshape = (<object>xa).shape
        if xa.ndim == 0 or xshape[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by world_size "
                             f"{self.world_size}; got shape {xshape}")
        shape = (xshape[0] // self.world_size,) + xshape[1:]
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty(shape, xa.dtype)
        else:
            oa = check_out(out, shape, xa.dtype)
            if cnp.PyArray_DATA(oa) == cnp.PyArray_DATA(xa):
                raise ValueError("reduce_scatter cannot write its block over x; pass a separate out")
            check_no_partial_overlap(oa, xa)
        cdef size_t n = <size_t>cnp.PyArray_SIZE(oa)
        cdef const void *xp = cnp.PyArray_DATA(xa)
        cdef void *op_ = cnp.PyArray_DATA(oa)
        cdef int st
        with nogil:
            st = sc_reduce_scatter(self.c, xp, op_, n, dt, op)
        if st:
            self._raise(st, "reduce_scatter")
        return oa

    def allgather(self, x, out):
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        dtype_code(xa)
        shape = (self.world_size,) + (<object>xa).shape
        cdef cnp.ndarray oa
        if out is None:
            oa = np.empty(shape, xa.dtype)
        else:
            oa = check_out(out, shape, xa.dtype)
            # x may be this rank's own row of out (in place), nothing else of it
            if _overlaps_other_rows(oa, xa, self.rank):
                raise ValueError("x overlaps rows of out other than this rank's own")
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        cdef const void *xp = cnp.PyArray_DATA(xa)
        cdef void *op_ = cnp.PyArray_DATA(oa)
        cdef int st
        with nogil:
            st = sc_allgather(self.c, xp, op_, nb)
        if st:
            self._raise(st, "allgather")
        return oa

    def abort(self):
        if self.c != NULL:
            sc_abort(self.c)

    def close(self, bint failed=False):
        if self.c != NULL:
            sc_detach(self.c, failed)
            self.c = NULL

    @property
    def closed(self):
        return self.c == NULL

    def __dealloc__(self):
        if self.c != NULL:
            sc_detach(self.c, 1)
            self.c = NULL


cdef inline int _check_op(int dt, int op, cnp.ndarray xa) except -1:
    if not sc_op_supported(dt, op):
        from shmcoll.ops import ReduceOp
        raise ValueError(f"op {ReduceOp.from_code(op).value!r} is not defined for dtype {xa.dtype}")
    return 0


cdef bint _overlaps_other_rows(cnp.ndarray out, cnp.ndarray x, int rank):
    cdef uintptr_t ob = <uintptr_t>cnp.PyArray_DATA(out), xb = <uintptr_t>cnp.PyArray_DATA(x)
    cdef uintptr_t nb = <uintptr_t>cnp.PyArray_NBYTES(x)
    cdef uintptr_t oe = ob + <uintptr_t>cnp.PyArray_NBYTES(out)
    if nb == 0 or xb + nb <= ob or xb >= oe:
        return False
    return xb != ob + rank * nb
