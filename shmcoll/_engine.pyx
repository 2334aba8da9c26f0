# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The one place where Python meets the C engine.

Each collective resolves its buffers once (numpy C-API, no Python per chunk), drops
the GIL for a single C call, and turns the C status into an exception here.
"""
from libc.math cimport INFINITY
from libc.stdlib cimport free, realloc
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from posix.unistd cimport close as close_fd, dup, usleep
cimport numpy as cnp
import collections
import copy
import hashlib
import importlib.util
import os
import sys
import time

import numpy as np

from shmcoll.errors import (ClosedError, CommunicatorBrokenError, ConcurrentCallError,
                            JobAbortedError, JoinRefusedError, MismatchError,
                            OutOfMemoryError, PeerLostError, SegmentError,
                            SharedMemoryFullError, TimeoutError as ShmTimeoutError)

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    bint equiv_types "PyArray_EquivTypes"(cnp.PyArray_Descr *a, cnp.PyArray_Descr *b)
    bint holds_objects "PyDataType_REFCHK"(cnp.PyArray_Descr *d)

cdef extern from "csrc/shmcoll.h" nogil:
    ctypedef struct sc_comm:
        pass
    ctypedef struct sc_params:
        double timeout_s
        uint64_t spin_ns
        uint64_t yield_ns
        uint64_t slot_bytes
        unsigned int nslots
        uint64_t stream_bytes
        int (*interrupted)() noexcept
    enum:
        SC_OK, SC_ETIMEDOUT, SC_EPEERLOST, SC_EABORTED, SC_EINVAL, SC_ELAYOUT,
        SC_ERANKTAKEN, SC_EBROKEN, SC_EINTR, SC_EMISMATCH, SC_ECLOSED, SC_ENOMEM,
        SC_ENOSPACE, SC_EREFUSED, SC_ETRUNCATE
    enum:
        SC_REFUSE_WORLD, SC_REFUSE_RANK_TAKEN, SC_REFUSE_COLLISION, SC_REFUSE_NO_SPACE
    enum:
        SC_INT8, SC_UINT8, SC_INT16, SC_UINT16, SC_INT32, SC_UINT32, SC_INT64,
        SC_UINT64, SC_FLOAT16, SC_BFLOAT16, SC_FLOAT32, SC_FLOAT64, SC_NDTYPES
    size_t sc_segment_size(int world, const sc_params *p)
    size_t sc_control_bytes(int world)
    size_t sc_channel_bytes(uint64_t slot_bytes, unsigned int nslots)
    int sc_reserve(int fd, size_t off, size_t len)
    void *sc_map(int fd, size_t size, int *err)
    void sc_unmap(void *base, size_t size)
    int sc_format(void *base, size_t size, int world, const sc_params *p, uint64_t token, int pid)
    int sc_segment_world(const void *base, size_t size)
    int sc_segment_creator(const void *base, size_t size)
    int sc_segment_pids(const void *base, size_t size, int32_t *pids, int max)
    sc_comm *sc_attach(void *base, size_t size, int fd, int rank, int world, uint64_t token,
                       const sc_params *wait, int *status, int *last)
    int sc_wait_attached(sc_comm *c)
    void sc_detach(sc_comm *c, int failed)
    void sc_segment_abort(void *base, size_t size, int failed_rank)
    void sc_segment_refuse(void *base, size_t size, int rank, int reason, int64_t expected,
                           int64_t got)
    void sc_segment_refusal(const void *base, size_t size, int64_t out[4])
    void sc_request_close(sc_comm *c)
    uint64_t sc_call_number(const sc_comm *c)
    uint64_t sc_attached_count(const sc_comm *c)
    ctypedef struct sc_args:
        int collective, algo, dtype, op, root
        const void *x
        void *out
        size_t count
        const uint64_t *layout
        const char *sym_x
        char *sym_out
        size_t sym_x_stride, sym_out_stride
        int64_t sym_x_id, sym_out_id
    enum:
        SC_COLL_BARRIER, SC_COLL_ALLREDUCE, SC_COLL_REDUCE_SCATTER, SC_COLL_ALLGATHER,
        SC_COLL_BROADCAST, SC_COLL_REDUCE, SC_COLL_GATHER, SC_COLL_SCATTER,
        SC_COLL_ALLTOALL, SC_COLL_ALLTOALLV, SC_NCOLLECTIVES
    enum:
        SC_ALGO_RING, SC_ALGO_DIRECT, SC_ALGO_DIRECT_TWO_SHOT, SC_ALGO_TREE,
        SC_ALGO_RHD_DOUBLING, SC_ALGO_RHD_HALVING, SC_ALGO_NAIVE, SC_ALGO_BRUCK,
        SC_ALGO_SYMMETRIC, SC_ALGO_SYMMETRIC_TWO_SHOT, SC_ALGO_CMA, SC_ALGO_CMA_TWO_SHOT,
        SC_ALGO_DIRECT_INLINE, SC_ALGO_DIRECT_EAGER,
        SC_NALGOS, SC_INLINE_BYTES, SC_EAGER_BYTES
    enum:
        SC_ANY_TAG, SC_P2P_SEND, SC_P2P_RECV, SC_WORK_P2P, SC_P2P_FRAME_BYTES
    ctypedef struct sc_p2p_op:
        int kind, peer
        int64_t tag, dtype
        void *buf
        uint64_t bytes
        int status
        int64_t got_tag, got_dtype
        uint64_t got_bytes
    int sc_p2p(sc_comm *c, sc_p2p_op **ops, int n)
    int64_t sc_p2p_self_room(const sc_comm *c)
    int sc_barrier(sc_comm *c)
    int sc_cma_agree(sc_comm *c, int allowed, int *agreed, double costs[4])
    int sc_run(sc_comm *c, const sc_args *a)
    void sc_hold(sc_comm *c, uint64_t hold_ns, void (*release)(void *) noexcept nogil, void *arg)
    int sc_implements(int collective, int algo)
    void sc_mismatch_info(const sc_comm *c, int64_t out[6])
    int sc_ranks_missing(const sc_comm *c, int *out, int max)
    int sc_error_peer(const sc_comm *c, int p2p)
    int sc_error_waited(const sc_comm *c, int p2p)
    const char *sc_error_what(const sc_comm *c, int p2p)
    int sc_op_supported(int dtype, int op)
    void sc_layout(int64_t out[9])
    int sc_pid_dead(int32_t pid)
    ctypedef struct sc_work:
        sc_args args
        sc_p2p_op *ops
        int nops
        uint64_t ticket
        int status, skipped, err_peer, err_waited
        const char *err_what
    ctypedef struct sc_progress:
        pass
    sc_progress *sc_progress_start(sc_comm *c, uint64_t spin_ns, int *err)
    uint64_t sc_progress_submit(sc_progress *p, sc_work *w)
    uint64_t sc_progress_completed(sc_progress *p)
    int sc_progress_wait(sc_progress *p, uint64_t ticket, double timeout_s,
                         int (*interrupted)() noexcept)
    int sc_work_finished(const sc_work *w)
    int sc_progress_wait_work(sc_progress *p, const sc_work *w, double timeout_s,
                              int (*interrupted)() noexcept)
    void sc_progress_stop(sc_progress *p)
    void sc_progress_free(sc_progress *p)


DEF MAX_BUILTIN_NUM = 64
cdef int _code_by_num[MAX_BUILTIN_NUM]   # builtin numpy type numbers -> engine code
cdef dict _code_by_user_num = {}          # user dtypes (ml_dtypes.bfloat16)
_NAMES = {}


def _register_dtypes():
    for i in range(MAX_BUILTIN_NUM):
        _code_by_num[i] = -1
    by_kind_size = {("i", 1): SC_INT8, ("u", 1): SC_UINT8, ("i", 2): SC_INT16,
                    ("u", 2): SC_UINT16, ("i", 4): SC_INT32, ("u", 4): SC_UINT32,
                    ("i", 8): SC_INT64, ("u", 8): SC_UINT64, ("f", 2): SC_FLOAT16,
                    ("f", 4): SC_FLOAT32, ("f", 8): SC_FLOAT64}
    # Every builtin type code, so that e.g. longlong and long both map to int64.
    for char in np.typecodes["AllInteger"] + np.typecodes["Float"]:
        dt = np.dtype(char)
        code = by_kind_size.get((dt.kind, dt.itemsize))
        if code is not None and dt.num < MAX_BUILTIN_NUM:
            _code_by_num[dt.num] = code
            _NAMES[code] = np.dtype(f"{dt.kind}{dt.itemsize}").name
    # bfloat16 comes from ml_dtypes, whose import costs most of a second (it registers
    # hundreds of ufunc loops): it is looked for here, and imported only by whoever
    # makes a bfloat16 array — which _user_code then finds in sys.modules.
    if importlib.util.find_spec("ml_dtypes") is not None:
        _NAMES[SC_BFLOAT16] = "bfloat16"


cdef int _user_code(int num) except -2:
    """The engine code of a user (non-builtin) dtype number, or -1.  An array of
    ml_dtypes' bfloat16 exists only once ml_dtypes was imported, so a miss looks
    there first."""
    code = _code_by_user_num.get(num)
    if code is None:
        ml_dtypes = sys.modules.get("ml_dtypes")
        if ml_dtypes is None or SC_BFLOAT16 in _code_by_user_num.values():
            return -1
        _code_by_user_num[np.dtype(ml_dtypes.bfloat16).num] = SC_BFLOAT16
        _NAMES[SC_BFLOAT16] = "bfloat16"
        code = _code_by_user_num.get(num, -1)
    return code


_register_dtypes()
SUPPORTED_DTYPES = tuple(sorted(_NAMES.values()))

# The type of a copy-only collective's arrays is part of its call record: ranks whose
# arrays differ in kind, item size or byte order move the same bytes but mean other
# values by them, so they get MismatchError (a rank that wants raw bytes views its
# array as uint8, as every rank must then do).  Reducible numpy types keep their engine
# code (int64 is one type however it is spelled), bool has its own, anything else
# (complex, strings, records, datetimes with units, other byte orders) is a 30-bit
# hash of its full description, tagged by bit 30 so it never equals a code.
_COPY_BOOL = SC_NDTYPES
_COPY_HASHED = 1 << 30
cdef dict _copy_code_by_dtype = {}


def _copy_code_of(dt):
    code = _copy_code_by_dtype.get(dt)
    if code is None:
        if dt.kind == "b":
            code = _COPY_BOOL
        else:
            code = _user_code(dt.num)
        if code < 0:
            text = f"{dt.str}|{dt.descr if dt.fields else ''}|{dt.shape}".encode()
            digest = int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "little")
            code = _COPY_HASHED | (digest & (_COPY_HASHED - 1))
            _TYPE_NAMES[code] = str(dt)
        if len(_copy_code_by_dtype) < 4096:
            _copy_code_by_dtype[dt] = code
    return code


_TYPE_NAMES = {}


cdef inline int copy_code(cnp.ndarray a) except -1:
    """The type code a copy-only collective publishes for `a` (see _copy_code_of)."""
    cdef int num = cnp.PyArray_TYPE(a)
    if num < MAX_BUILTIN_NUM and _code_by_num[num] >= 0 and cnp.PyArray_ISNOTSWAPPED(a):
        return _code_by_num[num]
    return _copy_code_of(a.dtype)


cdef int dtype_code(cnp.ndarray a) except -1:
    cdef int num = cnp.PyArray_TYPE(a)
    cdef int code = -1
    if num < MAX_BUILTIN_NUM:
        code = _code_by_num[num]
    else:
        code = _user_code(num)
    if code < 0 or not cnp.PyArray_ISNOTSWAPPED(a):
        raise TypeError(f"unsupported dtype {a.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return code


cdef cnp.ndarray as_input(object x):
    """Inputs are read only, so a non-contiguous or non-array input is copied."""
    if not cnp.PyArray_Check(x):
        x = np.asarray(x)
    if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
        x = np.ascontiguousarray(x)
    return <cnp.ndarray>x


DEF MAX_NDIM = 64


cdef cnp.ndarray check_out(object out, cnp.ndarray like, int ndim, cnp.npy_intp *dims):
    """`out` receives the result, so it is never silently replaced by a copy.
    It must have like's dtype and the shape dims[:ndim]."""
    if not cnp.PyArray_Check(out):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    cdef cnp.ndarray o = <cnp.ndarray>out
    if not equiv_types(cnp.PyArray_DESCR(o), cnp.PyArray_DESCR(like)):
        raise TypeError(f"out has dtype {out.dtype}, expected {like.dtype}")
    cdef bint same = cnp.PyArray_NDIM(o) == ndim
    cdef int i
    for i in range(ndim if same else 0):
        same = same and cnp.PyArray_DIMS(o)[i] == dims[i]
    if not same:
        raise ValueError(f"out has shape {out.shape}, expected {dims_tuple(ndim, dims)}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(o):
        raise ValueError("out must be C-contiguous (results cannot be written through a copy)")
    if not cnp.PyArray_ISWRITEABLE(o):
        raise ValueError("out is read-only")
    return o


cdef int check_no_partial_overlap(cnp.ndarray o, cnp.ndarray x, bint same_ok=True) except -1:
    cdef uintptr_t ob = <uintptr_t>cnp.PyArray_DATA(o), xb = <uintptr_t>cnp.PyArray_DATA(x)
    cdef uintptr_t oe = ob + <uintptr_t>cnp.PyArray_NBYTES(o), xe = xb + <uintptr_t>cnp.PyArray_NBYTES(x)
    if (ob != xb or not same_ok) and ob < xe and xb < oe:
        raise ValueError("out partially overlaps x; pass out=x for in place, or a separate array")
    return 0


cdef cnp.ndarray empty(int nd, cnp.npy_intp *dims, cnp.ndarray like):
    """A new C-contiguous array of like's dtype.  Builtin numeric types in native byte
    order go through the C API; anything whose type number does not say it all
    (byte-swapped numbers, records, strings, datetimes with units, user types such as
    bfloat16) through numpy: the bytes are copied as they are, so a native array would
    read a byte-swapped x's values swapped."""
    if cnp.PyArray_ISNUMBER(like) and cnp.PyArray_ISNOTSWAPPED(like):
        return cnp.PyArray_EMPTY(nd, dims, cnp.PyArray_TYPE(like), 0)
    return np.empty(dims_tuple(nd, dims), dtype=like.dtype)


cdef tuple dims_tuple(int nd, cnp.npy_intp *dims):
    # A list, not a generator expression: a generator in the caller makes Cython
    # allocate a closure (a garbage-collected object) on every call, error or not.
    return tuple([dims[i] for i in range(nd)])


cdef cnp.ndarray reduction_input(object x, int op, int *dt, int *lanes):
    """x as a C-contiguous array of a reducible dtype for which `op` is defined; the
    engine reduces `lanes` elements of type dt per element of x (see _lanes_of)."""
    cdef cnp.ndarray xa = as_input(x)
    cdef int num = cnp.PyArray_TYPE(xa)
    lanes[0] = 1
    if num < MAX_BUILTIN_NUM and _code_by_num[num] >= 0 and cnp.PyArray_ISNOTSWAPPED(xa):
        dt[0] = _code_by_num[num]
    elif cnp.PyArray_ISNOTSWAPPED(xa) and num in _LANES:
        dt[0], lanes[0] = _lanes_of(num, op, xa)
        return xa
    else:
        dt[0] = dtype_code(xa)
    _check_op(dt[0], op, xa)
    return xa


# Types the engine reduces as other types, where the op means the same thing:
# bool as uint8 0/1 (max = any, min = all, band, bor, bxor); complex as its (real,
# imaginary) pair of floats, for sum and avg (prod, min and max are not elementwise
# on the parts).
_LANES = {np.dtype(np.bool_).num: (SC_UINT8, 1, ("max", "min", "band", "bor", "bxor")),
          np.dtype(np.complex64).num: (SC_FLOAT32, 2, ("sum", "avg")),
          np.dtype(np.complex128).num: (SC_FLOAT64, 2, ("sum", "avg"))}


def _lanes_of(num, op, xa):
    from shmcoll.ops import ReduceOp
    code, lanes, ops = _LANES[num]
    name = ReduceOp.from_code(op).value
    if name not in ops:
        why = ("a sum or product of booleans is not a boolean; use max (any) or min (all), "
               "or cast to an integer type" if lanes == 1 else
               "complex numbers reduce by sum and avg only (a product or an order is not "
               "elementwise on the real and imaginary parts)")
        raise ValueError(f"op {name!r} is not defined for dtype {xa.dtype}: {why}")
    return code, lanes


cdef cnp.ndarray out_like(object out, cnp.ndarray xa, bint inplace_ok):
    """`out` of x's shape and dtype (allocated when None); out=x is in place."""
    if out is None:
        return empty(cnp.PyArray_NDIM(xa), cnp.PyArray_DIMS(xa), xa)
    cdef cnp.ndarray oa = check_out(out, xa, cnp.PyArray_NDIM(xa), cnp.PyArray_DIMS(xa))
    check_no_partial_overlap(oa, xa, inplace_ok)
    return oa


cdef cnp.ndarray stacked_out(object out, cnp.ndarray xa, int world, int rank):
    """`out` of shape (world, *x.shape); x may be this rank's own row of it."""
    cdef int nd = cnp.PyArray_NDIM(xa) + 1
    if nd > MAX_NDIM:
        raise ValueError(f"at most {MAX_NDIM - 1} dimensions are supported")
    cdef cnp.npy_intp dims[MAX_NDIM]
    cdef int i
    dims[0] = world
    for i in range(1, nd):
        dims[i] = cnp.PyArray_DIMS(xa)[i - 1]
    if out is None:
        return empty(nd, dims, xa)
    cdef cnp.ndarray oa = check_out(out, xa, nd, dims)
    if _overlaps_other_rows(oa, xa, rank):
        raise ValueError("x overlaps rows of out other than this rank's own")
    return oa


cdef cnp.ndarray check_buffer(object a, str name):
    """An array the collective writes into: never silently replaced by a copy."""
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous (results cannot be written through a copy)")
    if not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")
    return arr


cdef int check_copyable(cnp.ndarray a) except -1:
    """Copy-only collectives move raw bytes: any dtype without Python objects."""
    if holds_objects(cnp.PyArray_DESCR(a)):
        raise TypeError(f"dtype {a.dtype} holds Python objects, which cannot be shared "
                        f"between processes")
    return 0


cdef class Segment:
    """A mapping of one shared segment (the name is managed by shmcoll._core.segment).  It
    keeps a descriptor of the segment's file, through which ranks reserve memory for
    their channels at first use (sc_reserve)."""
    cdef void *base
    cdef readonly size_t size
    cdef int fd

    def __cinit__(self, int fd, size_t size):
        cdef int err = 0
        self.fd = -1
        self.base = sc_map(fd, size, &err)
        if self.base == NULL:
            raise SegmentError(f"cannot map the shared segment: {_strerror(err)}")
        self.size = size
        self.fd = dup(fd)

    def identity(self):
        """(device, inode) of the segment's file."""
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def reserve(self, size_t offset, size_t length):
        """Back [offset, offset + length) with memory now; 0 or an errno."""
        return sc_reserve(self.fd, offset, length)

    def refuse(self, int rank, int reason, int64_t expected, int64_t got):
        """Refuse `rank` at join: every rank of the job fails at once naming why."""
        sc_segment_refuse(self.base, self.size, rank, reason, expected, got)

    def refusal(self):
        """The JoinRefusedError of a job refused at join, or None."""
        cdef int64_t info[4]
        sc_segment_refusal(self.base, self.size, info)
        return _refusal_error(info) if info[1] else None

    def format(self, int world, params, uint64_t token, int pid):
        cdef sc_params p = _params(params)
        if sc_format(self.base, self.size, world, &p, token, pid) != SC_OK:
            raise ValueError(f"invalid segment parameters {params} for world size {world}")

    def world(self):
        return sc_segment_world(self.base, self.size)

    def creator(self):
        return sc_segment_creator(self.base, self.size)

    def pids(self):
        """[creator pid, rank 0 pid, ...] (0 for ranks not attached), or None if invalid."""
        cdef int32_t buf[1025]
        cdef int n = sc_segment_pids(self.base, self.size, buf, 1025)
        return None if n < 0 else [buf[i] for i in range(n)]

    def abort(self, int failed_rank=-1):
        """Make every rank's waits fail at once, naming `failed_rank` as lost."""
        sc_segment_abort(self.base, self.size, failed_rank)

    def __dealloc__(self):
        sc_unmap(self.base, self.size)
        self.base = NULL
        if self.fd >= 0:
            close_fd(self.fd)
            self.fd = -1


REFUSE_WORLD, REFUSE_RANK_TAKEN, REFUSE_COLLISION, REFUSE_NO_SPACE = (
    SC_REFUSE_WORLD, SC_REFUSE_RANK_TAKEN, SC_REFUSE_COLLISION, SC_REFUSE_NO_SPACE)


def _refusal_error(info):
    rank, reason, expected, got = (int(v) for v in info[:4])
    if reason == SC_REFUSE_WORLD:
        why = f"rank {rank} passed world size {got}, but the job was created for {expected}"
    elif reason == SC_REFUSE_RANK_TAKEN:
        why = f"rank {rank} is already taken by another process of this job (pid {expected})"
    elif reason == SC_REFUSE_COLLISION:
        why = (f"a second job is forming under the same job name (its rank 0, pid {got}, "
               f"found this one's, pid {expected}); which process belongs to which job "
               f"cannot be told, so neither forms: give concurrent jobs distinct names")
    elif reason == SC_REFUSE_NO_SPACE:
        why = (f"/dev/shm is too full: rank {rank} needed {expected} more bytes for its "
               f"channel, {got} were free")
    else:
        why = f"rank {rank} was refused (reason code {reason}: the segment is corrupt)"
    return JoinRefusedError(f"the job cannot form: {why}", rank, reason)


def layout():
    """Offsets of the segment's parts (sc_layout), for tests that corrupt it."""
    cdef int64_t out[9]
    sc_layout(out)
    names = ("attached", "ranks", "rank_block", "calls", "call_slot", "call_fields", "state",
             "pid", "cma_verdict")
    return {n: int(out[i]) for i, n in enumerate(names)}


def control_bytes(int world):
    """Bytes every job of `world` ranks touches whatever it runs (reserved at creation)."""
    return sc_control_bytes(world)


def channel_bytes(params):
    """Bytes of one channel's slots under `params` (what its sender reserves)."""
    return sc_channel_bytes(params.slot_bytes, params.nslots)


def pid_alive(int pid):
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as dead."""
    return not sc_pid_dead(pid)


def segment_size(int world, params):
    cdef sc_params p = _params(params)
    return sc_segment_size(world, &p)


cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident()


cdef extern from "Python.h":
    # Declared without an exception clause: the exception a signal handler raises
    # must stay set until the collective returns and re-raises it.
    int check_signals "PyErr_CheckSignals"()


cdef extern from "Python.h":
    ctypedef struct PyThreadState
    PyThreadState *PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState *) nogil


cdef void _release_gil(void *saved) noexcept nogil:
    """sc_hold's release: drop the GIL, keeping this thread's state in *saved."""
    (<PyThreadState **>saved)[0] = PyEval_SaveThread()


cdef int _interrupted() noexcept nogil:
    """Run Python's signal handlers from inside a long wait (main thread only)."""
    cdef int raised
    with gil:
        raised = check_signals()
    return raised != 0


cdef sc_params _params(object params) except *:
    cdef sc_params p
    p.timeout_s = params.timeout
    p.spin_ns = <uint64_t>(params.spin_us * 1000)
    p.yield_ns = <uint64_t>(params.yield_us * 1000)
    p.slot_bytes = params.slot_bytes
    p.nslots = params.nslots
    p.stream_bytes = params.stream_bytes
    p.interrupted = _interrupted
    return p


def _strerror(int err):
    return os.strerror(err) if err else "not a shmcoll segment"



# A symmetric allocation (shmcoll.symmetric) as the engine looks it up: rank q's
# slice starts at base + q * stride in this process.
ctypedef struct sym_region:
    uintptr_t base
    size_t stride
    int64_t ident       # the allocation's number, the same on every rank

# Where an array lies in its symmetric allocation: (number << SYM_OFFSET_BITS) | offset,
# with SYM_ROWS set for an x that is row `rank` of a stacked out (in-place AllGather).
DEF SYM_OFFSET_BITS = 40
DEF SYM_ROWS = 1 << 62

# Calls of at most HOLD_BYTES keep the GIL through their first HOLD_NS of waiting
# (sc_hold): dropping and taking it back is ~30 ns, a tenth of an 8-byte AllReduce, and
# such a call usually ends first.  Longer calls, or waits, let other threads run.
DEF HOLD_BYTES = 16384
DEF HOLD_NS = 10000

# _run's xbytes of collectives without single-copy schedules.
DEF NO_SINGLE_COPY = 0xFFFFFFFFFFFFFFFF

# What the symmetric schedules of an AllReduce may run, by where out lies.
DEF SYM_OUT_PLAIN = 0       # out is not symmetric: one-shot
DEF SYM_OUT_SYMMETRIC = 1   # out is symmetric too: one-shot or two-shot
DEF SYM_IN_PLACE = 2        # out is x: two-shot

# The engine's two queues of nonblocking calls (Engine.lanes).
DEF COLLECTIVES = 0         # collectives and barriers
DEF MESSAGES = 1            # point-to-point operations


cdef class Engine:
    """One rank's attachment to a segment; owns no name, only the mapping's use.

    `decider` (shmcoll.tuning.decider.Decider) picks each call's schedule; the
    engine reads the codes it remembers per size and asks it only for a size (and
    algo) not seen yet, so the cost model runs once per size, not once per call.

    One call at a time: every entry into C takes the `_active` word (under the GIL,
    so taking it is atomic) and a second thread's call raises ConcurrentCallError
    instead of interleaving with the first on the same channels.  close() from
    another thread asks the running call to give up and waits for it to leave before
    the C state is freed; from the running call's own thread (a signal handler) it
    leaves the freeing to that call's exit.

    Nonblocking calls (async_op=True) are checked here, then queued on a progress
    thread (sc_progress.c, started at the first) and returned as a Work.  There are two
    queues, each with its thread: collectives (and barriers) on one, point-to-point
    operations on the other, as MPI keeps the two apart.  Each thread runs its calls in
    order with the code a blocking call runs; a blocking call first waits for the
    calls queued before it on its own queue, so every rank keeps one sequence of
    collectives and one of messages, and neither waits for the other: a pending
    receive never holds back a collective, nor a pending collective a send.  The
    engine keeps each Work, and so its buffers, until it completed; an engine with
    works outstanding stays in _BUSY, so it is never garbage while a thread writes them.
    """
    cdef sc_comm *c
    cdef Segment seg
    cdef readonly int rank, world_size
    cdef readonly bint completed_attach
    cdef object _decider
    cdef public str closed_reason
    cdef dict _codes            # the decider's: collective code -> {size: schedule, algo: {size: schedule}}
    cdef double _timeout
    cdef size_t _channel_bytes
    cdef uint64_t _message_room # the largest message a channel holds whole (its frame aside)
    cdef uint64_t _spin_ns      # the parameters' busy-polling (see _submit for the thread's)
    cdef int _active            # a call is inside C
    cdef unsigned long _owner   # the thread of that call
    cdef int _close_pending     # close() came from that thread: detach when it leaves
    cdef bint _close_failed
    # The two queues of nonblocking calls, [COLLECTIVES] and [MESSAGES] (each NULL
    # before its first call); per queue, its Works not settled yet (in submission
    # order), the last one's ticket, and the exception of the first that failed.
    cdef sc_progress *lanes[2]
    cdef object _works
    cdef uint64_t _last_ticket[2]
    cdef object _first_error
    cdef bint _closing          # close() is waiting for the works: no new ones
    # What broke the communicator, for later calls' errors: [COLLECTIVES] a failed
    # collective (which breaks both kinds), [MESSAGES] a failed send or receive too.
    cdef list _broken_by
    cdef sym_region *_sym       # symmetric allocations, in the order they were made
    cdef int _nsym
    cdef public object symmetric_decide   # (collective, nbytes, algo, out case, blocking) -> (code, trial)
    cdef readonly object cross_memory     # (s per read, ρ, ρ unchanged, ω) once agreed, or None
    cdef dict _sym_codes
    cdef object __weakref__

    def __cinit__(self, Segment seg, int rank, int world, uint64_t token, params):
        cdef int status = 0, last = 0
        cdef sc_params p = _params(params)
        self.seg = seg
        self.c = sc_attach(seg.base, seg.size, seg.fd, rank, world, token, &p, &status, &last)
        if self.c == NULL:
            refused = seg.refusal()
            if status in (SC_ERANKTAKEN, SC_EINVAL, SC_ENOSPACE) and refused is not None:
                raise refused
            if status == SC_ENOMEM:
                raise OutOfMemoryError(f"joining the job on rank {rank}: no memory for the "
                                       f"communicator's process-local state")
            raise SegmentError("the shared segment is not a shmcoll segment of this job and version")
        self.rank = rank
        self.world_size = world
        self.completed_attach = last
        self._timeout = p.timeout_s
        self._channel_bytes = sc_channel_bytes(p.slot_bytes, p.nslots)
        self._message_room = p.slot_bytes * p.nslots - SC_P2P_FRAME_BYTES
        self._spin_ns = p.spin_ns
        self.closed_reason = "the communicator is closed"
        self._works = (collections.deque(), collections.deque())
        self._first_error = [None, None]
        self._broken_by = [None, None]
        self._sym_codes = {}

    cdef int _enter(self, int lane=COLLECTIVES) except -1:
        """Take the communicator for one call (GIL held: check and set are atomic),
        once the nonblocking calls queued before it on its queue (`lane`) have
        completed."""
        if self.c == NULL:
            raise ClosedError(self.closed_reason)
        if self._active:
            raise self._concurrent()
        self._active = 1
        self._owner = PyThread_get_thread_ident()
        if self._queued(lane):
            try:
                self._drain_lane(lane)
            except BaseException:
                self._leave()
                raise
        return 0

    cdef bint _queued(self, int lane):
        """Whether calls queued on `lane` have not completed yet."""
        return self.lanes[lane] != NULL and \
            self._last_ticket[lane] > sc_progress_completed(self.lanes[lane])

    cdef object _concurrent(self):
        return ConcurrentCallError(
            f"rank {self.rank}: another thread of this process is inside a collective on "
            f"this communicator; a communicator serves one call at a time (use one "
            f"communicator per thread, or serialise the calls)")

    cdef void _leave(self):
        self._active = 0
        if self._close_pending:
            self._close_pending = 0
            self._detach(self._close_failed)

    cdef int _raise(self, int status, str what, bint p2p=False) except -1:
        if status == SC_EINTR:
            self._broke(p2p, f"{what} was interrupted by a signal")
            return -1       # the handler's exception (KeyboardInterrupt...) is pending
        err = self._error(status, what, sc_error_peer(self.c, p2p),
                          sc_error_waited(self.c, p2p), sc_error_what(self.c, p2p).decode(), p2p)
        if status != SC_EBROKEN:
            self._broke(p2p, f"{type(err).__name__}: {err}")
        raise err

    cdef void _broke(self, bint p2p, str cause):
        """Remember the first cause of each kind's breakage: a collective's failure
        breaks both kinds of call (sc_run), a send's or receive's only messages."""
        if not p2p and self._broken_by[COLLECTIVES] is None:
            self._broken_by[COLLECTIVES] = cause
        if self._broken_by[MESSAGES] is None:
            self._broken_by[MESSAGES] = cause

    cdef object _error(self, int status, str what, int peer, int waited, str where,
                       bint p2p=False):
        """The exception of a call that ended with `status`, blaming `peer` while this
        rank was `where` (a phrase taking rank `waited` as its object)."""
        if status == SC_EMISMATCH:
            return _mismatch_error(self.c, what, self.rank)
        if waited >= 0:
            where = f"{where} rank {waited}"
        here = f"{what} on rank {self.rank}"
        if status == SC_ETIMEDOUT:
            return self._timeout_error(here, where, waited)
        if status == SC_EPEERLOST:
            who = f"rank {peer}" if peer >= 0 else "a peer"
            return PeerLostError(f"{here}: {who} failed, died or closed its communicator "
                                 f"(this rank was {where})", peer if peer >= 0 else None)
        if status == SC_EABORTED:
            return JobAbortedError(f"{here}: the job was aborted by another rank or by its "
                                   f"launcher (this rank was {where})")
        if status == SC_EREFUSED:
            refused = self.seg.refusal()
            return refused if refused is not None else JoinRefusedError(f"{here}: refused")
        if status == SC_ECLOSED:
            return ClosedError(f"{here}: the communicator was closed during the call, by "
                               f"another thread or a signal handler (this rank was {where})")
        if status == SC_ENOSPACE:
            from shmcoll._core.segment import shm_free_bytes
            return SharedMemoryFullError(
                f"{here}: /dev/shm is too full to back the channel to rank {peer} "
                f"({self._channel_bytes} bytes needed, {shm_free_bytes()} free); the "
                f"communicator is unusable")
        if status == SC_ENOMEM:
            return OutOfMemoryError(f"{here}: out of memory {where}")
        if status == SC_EBROKEN:
            cause = self._broken_by[MESSAGES if p2p else COLLECTIVES]
            cause = f" ({cause})" if cause else ""
            kind = "call" if p2p else "collective"    # (messages break on either kind)
            return CommunicatorBrokenError(
                f"{here}: an earlier {kind} failed on this communicator{cause}; it is "
                f"unusable")
        return ValueError(f"{here}: the engine refused the arguments (status {status})")

    cdef object _timeout_error(self, str here, str where, int waited):
        """Ranks that never reached this call are named first: the rank this one was
        waiting for may itself be waiting for them."""
        missing = self._missing()
        after = f" after {self._timeout:g} s"     # a timeout that expired was finite
        if missing:
            stage = "joined the job" if sc_call_number(self.c) == 0 else "reached this call"
            return ShmTimeoutError(f"{here} timed out{after}: rank(s) {missing} never "
                                   f"{stage} (this rank was {where})", missing)
        joining = ""
        if sc_call_number(self.c) == 0:     # every rank holds its slot: say what was seen
            joining = (f" ({sc_attached_count(self.c)} of {self.world_size} attachments "
                       f"counted in segment inode {self.seg.identity()[1]})")
        return ShmTimeoutError(f"{here} timed out{after} {where}{joining}",
                               [waited] if waited >= 0 else [])

    cdef list _missing(self):
        cdef int buf[1024]
        cdef int n = sc_ranks_missing(self.c, buf, 1024)
        return [buf[i] for i in range(n)]

    cdef inline int _live(self) except -1:
        if self.c == NULL:
            raise ClosedError(self.closed_reason)
        return 0

    def disown(self):
        """In a forked child: forget the attachment without touching the shared state,
        which still belongs to the parent's rank."""
        if self.c != NULL:
            self.c = NULL   # the small process-local struct is left to the child's exit
            self.lanes[0] = self.lanes[1] = NULL    # so are the queues: not forked
            self._active = self._close_pending = 0
            self.closed_reason = ("this communicator belongs to the process that created it; "
                                  "a forked child must not use it (create one per process)")
            for works in self._works:
                while works:
                    (<Work>works.popleft())._settle(ClosedError(self.closed_reason))
            _BUSY.discard(self)

    cdef int _wait(self, int (*wait)(sc_comm *) noexcept nogil, str what) except -1:
        """One call of a C wait that takes only the communicator (keeping the GIL
        through its first HOLD_NS of waiting, as small collectives do)."""
        cdef int st
        cdef PyThreadState *saved = NULL
        self._enter()
        try:
            sc_hold(self.c, HOLD_NS, _release_gil, &saved)
            st = wait(self.c)
            sc_hold(self.c, 0, NULL, NULL)
            if saved != NULL:
                PyEval_RestoreThread(saved)
            if st:
                self._raise(st, what)
        finally:
            self._leave()
        return 0

    def wait_attached(self):
        self._wait(sc_wait_attached, "joining the job")

    def agree_cross_memory(self, bint allowed):
        """Once every rank attached, all together: whether every rank may read every
        other's memory with cross-memory attach (sc_cma.c; `allowed` False: this rank
        declines, and so the job does).  Returns None where it may not, else (seconds
        of a small read, ρ, ρ of bytes read before and unchanged since, ω of a write:
        see Communicator.cross_memory) — rank 0's measurement, the same on every rank."""
        cdef int st, agreed = 0
        cdef double costs[4]
        costs[0] = costs[1] = costs[2] = costs[3] = 0.0
        self._enter()
        try:
            with nogil:
                st = sc_cma_agree(self.c, allowed, &agreed, costs)
            if st:
                self._raise(st, "joining the job")
        finally:
            self._leave()
        self.cross_memory = (costs[0], costs[1], costs[2], costs[3]) if agreed else None
        return self.cross_memory

    def barrier(self, bint async_op=False):
        cdef sc_args a
        if async_op:
            a.collective, a.algo, a.dtype, a.op, a.root = SC_COLL_BARRIER, -1, -1, -1, -1
            a.x, a.out, a.count, a.layout = NULL, NULL, 0, NULL
            return self._submit(&a, None, None)
        self._wait(sc_barrier, "barrier")

    cdef object _run(self, int collective, object algo, int dtype, int op, int root,
                     const void *x, void *out, size_t count, size_t nbytes, object keep,
                     object result, bint async_op, const uint64_t *layout=NULL,
                     size_t xbytes=NO_SINGLE_COPY, size_t outbytes=0,
                     const void *rows=NULL):
        """The single C call of a collective (`nbytes` is the size the selector sees),
        which returns `result`; or, async_op, that call queued as a Work that keeps
        `keep` (the input) and `result` alive until it completed.  alltoallv passes
        its `layout` (and has one schedule).  Collectives with single-copy schedules
        pass the bytes of x and out: an x in a symmetric allocation takes them.
        AllGather and Gather pass the stacked out this rank was given (`rows`, also
        where unused): x as its row `rank` (in place) reads every peer's row there."""
        cdef sc_args a
        trial = None
        a.collective, a.dtype, a.op, a.root = collective, dtype, op, root
        a.x, a.out, a.count, a.layout = x, out, count, layout
        a.sym_x, a.sym_out, a.sym_x_stride, a.sym_out_stride = NULL, NULL, 0, 0
        a.sym_x_id, a.sym_out_id = -1, -1
        if self._nsym and xbytes != NO_SINGLE_COPY and self._single_copy_source(&a, xbytes, rows):
            code, trial = self._symmetric_choice(&a, nbytes, algo, outbytes, not async_op)
            a.algo = code
        elif layout != NULL:
            a.algo = SC_ALGO_DIRECT
        else:
            # the decider's schedule, remembered per (size, algo); a call it makes a
            # trial of (tuning.trials) reports its time to that trial
            code = (<dict>self._codes[collective]).get(nbytes if algo is None else algo)
            if algo is not None and code is not None:   # (a named algorithm's own sizes)
                code = (<dict>code).get(nbytes)
            if code is None:
                code, trial = self._decider.choose(COLLECTIVE_NAMES[collective], nbytes,
                                                   algo, not async_op)
            a.algo = code
        if async_op:
            return self._submit(&a, keep, result)
        cdef int st
        self._enter()
        started = time.perf_counter() if trial is not None else 0.0
        try:
            if nbytes <= HOLD_BYTES:
                st = self._run_holding(&a)
            else:
                with nogil:
                    st = sc_run(self.c, &a)
            if st:
                self._raise(st, COLLECTIVE_NAMES[collective])
        finally:
            self._leave()
        if trial is not None:
            trial.observe(time.perf_counter() - started)
        return result

    cdef int _run_holding(self, const sc_args *a) noexcept:
        """sc_run keeping the GIL until a wait lasts HOLD_NS (then sc_hold drops it,
        and it is taken back here)."""
        cdef PyThreadState *saved = NULL
        sc_hold(self.c, HOLD_NS, _release_gil, &saved)
        cdef int st = sc_run(self.c, a)
        sc_hold(self.c, 0, NULL, NULL)
        if saved != NULL:
            PyEval_RestoreThread(saved)
        return st

    # -- nonblocking calls ----------------------------------------------------------
    cdef Work _submit(self, sc_args *a, object keep, object result):
        """Queue one checked call on the progress thread (started at the first)."""
        cdef Work w = Work.__new__(Work)
        w.w.args = a[0]
        w.w.ops, w.w.nops = NULL, 0
        w.keep, w.result = keep, result
        return self._enqueue(w)

    cdef Work _enqueue(self, Work w):
        """Queue a work whose record is filled in, on its queue (started at the first)."""
        cdef int err = 0
        cdef int lane = _lane_of(&w.w)
        if self.c == NULL:
            raise ClosedError(self.closed_reason)
        if self._closing:
            raise ClosedError("the communicator is closing")
        if self._active:
            raise self._concurrent()
        if self.lanes[lane] == NULL:
            # Each queue adds a thread per rank: it spins only if each has a core.
            from shmcoll._core.topology import usable_cpus
            threads = 2 + (self.lanes[1 - lane] != NULL)
            spin = self._spin_ns if threads * self.world_size <= usable_cpus() else 0
            self.lanes[lane] = sc_progress_start(self.c, spin, &err)
            if self.lanes[lane] == NULL:
                raise OutOfMemoryError(f"rank {self.rank}: cannot start the progress thread "
                                       f"of nonblocking calls: {os.strerror(err)}")
        w.engine = self
        self._works[lane].append(w)
        _BUSY.add(self)
        self._last_ticket[lane] = sc_progress_submit(self.lanes[lane], &w.w)
        return w

    cdef int _drain(self) except -1:
        """Wait until every work submitted so far completed, and settle them.  Each
        work's own waits have the timeout."""
        self._drain_lane(COLLECTIVES)
        self._drain_lane(MESSAGES)
        return 0

    cdef int _drain_lane(self, int lane) except -1:
        """_drain for the works of one queue."""
        if self.lanes[lane] != NULL:
            self._await(lane, self._last_ticket[lane], INFINITY)
        return 0

    cdef int _resolve(self) except -1:
        """Settle the works that completed, in order on each queue: each gets its
        exception, if any, and lets go of its buffers."""
        cdef uint64_t done
        cdef Work w
        for lane in range(2):
            works = self._works[lane]
            done = sc_progress_completed(self.lanes[lane]) if self.lanes[lane] else 0
            while works:
                w = <Work>works[0]
                if w.w.ticket > done:
                    break
                works.popleft()
                if not w.settled:   # (a p2p work may have completed ahead of its turn)
                    w._settle(self._work_error(w) if w.w.status else None)
        if not self._works[0] and not self._works[1]:
            _BUSY.discard(self)
        return 0

    cdef object _work_error(self, Work w):
        what = _work_name(&w.w)
        cdef int lane = _lane_of(&w.w)
        first = self._first_error[lane]
        if w.w.status == SC_ETRUNCATE:      # one message did not fit: nothing broke
            return _truncated(w.w.ops, w.w.nops, what, self.rank)
        if w.w.skipped and first is not None:
            err = copy.copy(first)
            err.args = (f"{what} on rank {self.rank} was not run: an earlier call failed: "
                        f"{first}",) + tuple(first.args[1:])
            return err
        if w.w.status == SC_ECLOSED:
            err = ClosedError(f"{what} on rank {self.rank}: the communicator was closed "
                              f"before this nonblocking call completed")
        else:
            where = w.w.err_what.decode() if w.w.err_what != NULL else ""
            err = self._error(w.w.status, what, w.w.err_peer, w.w.err_waited, where,
                              lane == MESSAGES)
        if first is None:
            self._first_error[lane] = err
        if w.w.status != SC_EBROKEN:
            self._broke(lane == MESSAGES, f"{type(err).__name__}: {err}")
        return err

    cdef int _await(self, int lane, uint64_t ticket, double timeout) except -1:
        """Wait (GIL released, signal handlers run) up to `timeout` seconds for work
        `ticket` of `lane`, then settle what completed; 1 if that work did."""
        cdef int st
        cdef sc_progress *p = self.lanes[lane]
        with nogil:
            st = sc_progress_wait(p, ticket, timeout, _interrupted)
        if st == SC_EINTR:
            return -1       # the handler's exception (KeyboardInterrupt...) is pending
        self._resolve()
        return st == SC_OK

    cdef int _await_work(self, Work w, double timeout) except -1:
        """_await for one work: a point-to-point work completes as soon as its own
        messages moved (sc_progress_wait_work), and is settled then, ahead of the
        works issued before it; it stays queued (alive) until its turn.  1 if done."""
        cdef int st
        cdef sc_progress *p = self.lanes[_lane_of(&w.w)]
        with nogil:
            st = sc_progress_wait_work(p, &w.w, timeout, _interrupted)
        if st == SC_EINTR:
            return -1
        self._resolve()
        return self._settle_finished(w)

    cdef bint _settle_finished(self, Work w) except -1:
        """Settles w if it is a p2p work that completed ahead of its turn; whether w
        is settled."""
        if not w.settled and sc_work_finished(&w.w):
            w._settle(self._work_error(w) if w.w.status else None)
        return w.settled

    def finish_works(self):
        """Wait for every nonblocking call submitted so far (at exit, so that no call
        is cut off half-way while its peers run it)."""
        if self.c != NULL:
            self._drain()

    @property
    def outstanding(self):
        """Nonblocking calls submitted and not settled yet."""
        return len(self._works[0]) + len(self._works[1])

    # -- symmetric allocations ------------------------------------------------------
    def add_symmetric(self, uintptr_t base, size_t stride, int64_t ident):
        """Register a symmetric allocation: rank q's slice at base + q * stride here,
        until remove_symmetric(ident) (before the mapping goes away)."""
        if ident < 0 or ident >= (1 << (62 - SYM_OFFSET_BITS)) or stride >= (1 << SYM_OFFSET_BITS):
            raise ValueError("symmetric allocation out of the engine's range")
        cdef sym_region *grown = <sym_region *>realloc(self._sym, (self._nsym + 1) * sizeof(sym_region))
        if grown == NULL:
            raise MemoryError()
        self._sym = grown
        self._sym[self._nsym].base = base
        self._sym[self._nsym].stride = stride
        self._sym[self._nsym].ident = ident
        self._nsym += 1

    def remove_symmetric(self, int64_t ident):
        """Forget allocation `ident`: its mapping is going away."""
        cdef int i, j = 0
        for i in range(self._nsym):
            if self._sym[i].ident != ident:
                self._sym[j] = self._sym[i]
                j += 1
        self._nsym = j

    def symmetric_place(self, uintptr_t address, size_t nbytes):
        """Where [address, address + nbytes) lies in this rank's slice of a symmetric
        allocation: (number, offset), or None."""
        cdef const char *slice0
        cdef size_t stride
        cdef int64_t ident
        if not self._find_symmetric(<const void *>address, nbytes, &slice0, &stride, &ident):
            return None
        return ident >> SYM_OFFSET_BITS, ident & ((1 << SYM_OFFSET_BITS) - 1)

    cdef bint _find_symmetric(self, const void *p, size_t nbytes, const char **slice0,
                              size_t *stride, int64_t *ident):
        """Whether [p, p + nbytes) lies in this rank's slice of a symmetric allocation;
        if so, where rank 0's copy of it is, the slices' stride and its place."""
        cdef uintptr_t at = <uintptr_t>p, lo
        cdef int i
        for i in range(self._nsym):
            lo = self._sym[i].base + <uintptr_t>self.rank * self._sym[i].stride
            if lo <= at and at + nbytes <= lo + self._sym[i].stride:
                slice0[0] = <const char *>(self._sym[i].base + (at - lo))
                stride[0] = self._sym[i].stride
                ident[0] = (self._sym[i].ident << SYM_OFFSET_BITS) | <int64_t>(at - lo)
                if nbytes == 0:
                    ident[0] = 0    # nothing is read: any place agrees with any other
                return True
        return False

    cdef bint _single_copy_source(self, sc_args *a, size_t xbytes, const void *rows):
        """Whether x is symmetric, filling where rank q's copy of it is: at x's place
        in every slice, or (x as row `rank` of a symmetric `rows`) at row q of rank q's
        rows, a place of its own kind (SYM_ROWS) so that ranks that differ raise."""
        if (rows != NULL and xbytes and a.x == <const char *>rows + <size_t>self.rank * xbytes and
                self._find_symmetric(rows, xbytes * self.world_size, &a.sym_x,
                                     &a.sym_x_stride, &a.sym_x_id)):
            a.sym_x_stride += xbytes
            a.sym_x_id |= SYM_ROWS
            return True
        return self._find_symmetric(a.x, xbytes, &a.sym_x, &a.sym_x_stride, &a.sym_x_id)

    cdef tuple _symmetric_choice(self, sc_args *a, size_t nbytes, object algo,
                                 size_t outbytes, bint blocking):
        """(schedule, trial) of a call whose x is symmetric: the decider of symmetric
        inputs picks among every schedule, the single-copy ones included, as out
        allows; out's place is kept only for two-shot, which reads it.  While a trial
        settles the call's size class (tuning.trials), a blocking call runs the
        candidate whose turn it is and reports its time to `trial`; nothing is
        remembered until the winner is known."""
        cdef int case = SYM_OUT_PLAIN
        if a.out == a.x:
            case = SYM_IN_PLACE
            a.sym_out, a.sym_out_stride, a.sym_out_id = <char *>a.sym_x, a.sym_x_stride, a.sym_x_id
        elif (a.collective == SC_COLL_ALLREDUCE and a.out != NULL and
              self._find_symmetric(a.out, outbytes, <const char **>&a.sym_out,
                                   &a.sym_out_stride, &a.sym_out_id)):
            case = SYM_OUT_SYMMETRIC
        if a.collective != SC_COLL_ALLREDUCE:
            case = SYM_OUT_PLAIN
        key = (a.collective, nbytes, algo, case)
        code = self._sym_codes.get(key)
        trial = None
        if code is None:
            if self.symmetric_decide is None:
                raise RuntimeError("symmetric allocation without a decider")
            code, trial = self.symmetric_decide(COLLECTIVE_NAMES[a.collective], nbytes, algo,
                                                case, blocking)
            if blocking and trial is None:      # (a nonblocking call may run during a trial)
                if len(self._sym_codes) >= 4096:
                    self._sym_codes.clear()
                self._sym_codes[key] = code
        if code != SC_ALGO_SYMMETRIC_TWO_SHOT:
            a.sym_out, a.sym_out_stride, a.sym_out_id = NULL, 0, -1
        return code, trial

    @property
    def decider(self):
        return self._decider

    @decider.setter
    def decider(self, decider):
        self._decider, self._codes = decider, decider.codes

    cdef int _root(self, int root) except -1:
        if not 0 <= root < self.world_size:
            raise ValueError(f"root {root} is out of range for world size {self.world_size}")
        return root

    def allreduce(self, x, out, int op, algo=None, bint async_op=False):
        self._live()
        cdef int dt, lanes
        cdef cnp.ndarray xa = reduction_input(x, op, &dt, &lanes)
        cdef cnp.ndarray oa = out_like(out, xa, True)
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        return self._run(SC_COLL_ALLREDUCE, algo, dt, op, -1, cnp.PyArray_DATA(xa),
                         cnp.PyArray_DATA(oa), <size_t>cnp.PyArray_SIZE(xa) * lanes,
                         nb, xa, oa, async_op, NULL, nb, nb)

    def reduce(self, x, out, int op, int root, algo=None, bint async_op=False):
        self._live()
        self._root(root)
        cdef int dt, lanes
        cdef cnp.ndarray xa = reduction_input(x, op, &dt, &lanes)
        cdef cnp.ndarray oa = None
        cdef void *op_ = NULL
        # out is checked on every rank that passes one (a wrong buffer is a bug even
        # where it goes unused), and used on the root only
        if self.rank == root or out is not None:
            oa = out_like(out, xa, True)
            op_ = cnp.PyArray_DATA(oa)
        if self.rank != root:
            oa, op_ = None, NULL
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        return self._run(SC_COLL_REDUCE, algo, dt, op, root, cnp.PyArray_DATA(xa), op_,
                         <size_t>cnp.PyArray_SIZE(xa) * lanes, nb, xa, oa, async_op, NULL,
                         nb, nb if op_ != NULL else 0)

    def reduce_scatter(self, x, out, int op, algo=None, bint async_op=False):
        self._live()
        cdef int dt, lanes
        cdef cnp.ndarray xa = reduction_input(x, op, &dt, &lanes)
        cdef int nd = cnp.PyArray_NDIM(xa)
        if nd == 0 or cnp.PyArray_DIMS(xa)[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs x.shape[0] divisible by world_size "
                             f"{self.world_size}; got shape {(<object>xa).shape}")
        cdef cnp.npy_intp dims[MAX_NDIM]
        cdef int i
        for i in range(nd):
            dims[i] = cnp.PyArray_DIMS(xa)[i]
        dims[0] //= self.world_size
        cdef cnp.ndarray oa
        if out is None:
            oa = empty(nd, dims, xa)
        else:
            oa = check_out(out, xa, nd, dims)
            # In place means out is this rank's own block of x (each element of it
            # is read once, right before it is written); any other overlap is refused.
            if cnp.PyArray_DATA(oa) != <char *>cnp.PyArray_DATA(xa) + self.rank * cnp.PyArray_NBYTES(oa):
                check_no_partial_overlap(oa, xa, False)
        return self._run(SC_COLL_REDUCE_SCATTER, algo, dt, op, -1, cnp.PyArray_DATA(xa),
                         cnp.PyArray_DATA(oa), <size_t>cnp.PyArray_SIZE(oa) * lanes,
                         <size_t>cnp.PyArray_NBYTES(xa), xa, oa, async_op, NULL,
                         <size_t>cnp.PyArray_NBYTES(xa), <size_t>cnp.PyArray_NBYTES(oa))

    def allgather(self, x, out, algo=None, bint async_op=False):
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        check_copyable(xa)
        cdef cnp.ndarray oa = stacked_out(out, xa, self.world_size, self.rank)
        return self._run(SC_COLL_ALLGATHER, algo, copy_code(xa), -1, -1, cnp.PyArray_DATA(xa),
                         cnp.PyArray_DATA(oa), <size_t>cnp.PyArray_NBYTES(xa),
                         <size_t>cnp.PyArray_NBYTES(oa), xa, oa, async_op, NULL,
                         <size_t>cnp.PyArray_NBYTES(xa), <size_t>cnp.PyArray_NBYTES(oa),
                         cnp.PyArray_DATA(oa))

    def gather(self, x, out, int root, algo=None, bint async_op=False):
        self._live()
        self._root(root)
        cdef cnp.ndarray xa = as_input(x)
        check_copyable(xa)
        cdef cnp.ndarray oa = None
        cdef void *op_ = NULL
        cdef void *given = NULL
        if self.rank == root or out is not None:     # checked wherever passed, as in reduce
            oa = stacked_out(out, xa, self.world_size, self.rank)
            op_ = given = cnp.PyArray_DATA(oa)
        if self.rank != root:
            oa, op_ = None, NULL
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        return self._run(SC_COLL_GATHER, algo, copy_code(xa), -1, root, cnp.PyArray_DATA(xa),
                         op_, nb, nb * self.world_size, xa, oa, async_op, NULL, nb,
                         nb * self.world_size if op_ != NULL else 0, given)

    def scatter(self, x, out, int root, algo=None, bint async_op=False):
        self._live()
        self._root(root)
        cdef cnp.ndarray xa = None, oa
        cdef const void *xp = NULL
        if self.rank == root or out is None or x is not None:
            if x is None:
                raise ValueError("scatter: the root must pass x of shape (world_size, ...), and "
                                 "other ranks must pass out (their receive buffer) or x")
            xa = as_input(x)
            check_copyable(xa)
            if cnp.PyArray_NDIM(xa) == 0 or cnp.PyArray_DIMS(xa)[0] != self.world_size:
                raise ValueError(f"scatter needs x.shape[0] == world_size {self.world_size}; "
                                 f"got shape {(<object>xa).shape}")
        if self.rank == root:
            xp = cnp.PyArray_DATA(xa)
        if out is None:
            oa = empty(cnp.PyArray_NDIM(xa) - 1, cnp.PyArray_DIMS(xa) + 1, xa)
        elif xa is not None:
            oa = check_out(out, xa, cnp.PyArray_NDIM(xa) - 1, cnp.PyArray_DIMS(xa) + 1)
            if self.rank == root and cnp.PyArray_DATA(oa) != <char *>xp + self.rank * cnp.PyArray_NBYTES(oa):
                check_no_partial_overlap(oa, xa, False)
        else:
            oa = check_buffer(out, "out")
            check_copyable(oa)
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(oa)
        return self._run(SC_COLL_SCATTER, algo, copy_code(oa), -1, root, xp,
                         cnp.PyArray_DATA(oa), nb, nb * self.world_size, xa, oa, async_op)

    def broadcast(self, x, int root, algo=None, bint async_op=False):
        self._live()
        self._root(root)
        cdef cnp.ndarray xa = check_buffer(x, "x")
        check_copyable(xa)
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        return self._run(SC_COLL_BROADCAST, algo, copy_code(xa), -1, root,
                         cnp.PyArray_DATA(xa), NULL, nb, nb, None, xa, async_op, NULL, nb, 0)

    def alltoall(self, x, out, algo=None, bint async_op=False):
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        check_copyable(xa)
        if cnp.PyArray_NDIM(xa) == 0 or cnp.PyArray_DIMS(xa)[0] != self.world_size:
            raise ValueError(f"alltoall needs x.shape[0] == world_size {self.world_size}; "
                             f"got shape {(<object>xa).shape}")
        cdef cnp.ndarray oa = out_like(out, xa, False)
        cdef size_t nb = <size_t>cnp.PyArray_NBYTES(xa)
        return self._run(SC_COLL_ALLTOALL, algo, copy_code(xa), -1, -1, cnp.PyArray_DATA(xa),
                         cnp.PyArray_DATA(oa), nb // self.world_size, nb, xa, oa, async_op)

    def alltoallv(self, x, out, layout, size_t row_bytes, bint async_op=False):
        """x and out as checked by shmcoll.ragged; layout: uint64 byte offsets and
        lengths (send offsets, send lengths, receive offsets, receive lengths)."""
        self._live()
        cdef cnp.ndarray xa = as_input(x)
        check_copyable(xa)
        cdef cnp.ndarray oa = check_buffer(out, "out")
        check_no_partial_overlap(oa, xa, False)
        cdef cnp.ndarray la = np.ascontiguousarray(layout, dtype=np.uint64)
        if cnp.PyArray_SIZE(la) != 4 * self.world_size:
            raise ValueError("alltoallv: the layout needs 4 x world_size entries")
        return self._run(SC_COLL_ALLTOALLV, None, copy_code(xa), -1, -1, cnp.PyArray_DATA(xa),
                         cnp.PyArray_DATA(oa), row_bytes, <size_t>cnp.PyArray_NBYTES(xa),
                         (xa, la), oa, async_op, <const uint64_t *>cnp.PyArray_DATA(la))

    def p2p(self, list ops, result, bint async_op=False):
        """Point-to-point operations run together (one or two: send, recv,
        sendrecv), each (kind, peer, tag, array) with peer and tag checked by the
        communicator: kind 'send' reads its array (copied if not C-contiguous),
        'recv' writes its own.  Returns `result`, or a Work."""
        self._live()
        cdef int n = len(ops), i, st
        cdef sc_p2p_op local[2]
        cdef sc_p2p_op *cops = local
        cdef sc_p2p_op *ptrs[2]
        cdef Work w = None
        cdef cnp.ndarray arr
        if not 1 <= n <= 2:
            raise ValueError("one or two point-to-point operations at a time")
        if not async_op and self._queued(MESSAGES):
            # Behind nonblocking sends and receives a blocking one joins them as one
            # (the works queued before it progress with it: irecv, send, wait).
            return self.p2p(ops, result, True).wait()
        if async_op:
            w = Work.__new__(Work)
            cops = w.ops
        for i in range(n):
            kind, peer, tag, arr = ops[i]
            if kind == "send":
                arr = as_input(arr)
                cops[i].kind = SC_P2P_SEND
            else:
                check_buffer(arr, "out")
                cops[i].kind = SC_P2P_RECV
            check_copyable(arr)
            cops[i].peer, cops[i].tag, cops[i].dtype = peer, tag, copy_code(arr)
            cops[i].buf = cnp.PyArray_DATA(arr)
            cops[i].bytes = <uint64_t>cnp.PyArray_NBYTES(arr)
            ptrs[i] = &cops[i]
            if async_op:
                ops[i] = arr        # kept alive by the work
        if async_op:
            w.w.args.collective, w.w.args.algo = SC_WORK_P2P, -1
            w.w.args.x, w.w.args.out, w.w.args.count, w.w.args.layout = NULL, NULL, 0, NULL
            w.w.ops, w.w.nops = w.ops, n
            w.keep, w.result = ops, result
            return self._enqueue(w)
        self._enter(MESSAGES)
        try:
            if n == 1 and cops[0].kind == SC_P2P_SEND and cops[0].peer == self.rank:
                self._refuse_stuck_self_send(cops[0].bytes)
            with nogil:
                st = sc_p2p(self.c, ptrs, n)
            if st:
                self._raise(st, _p2p_name(cops, n), True)
        finally:
            self._leave()
        for i in range(n):
            if cops[i].status == SC_ETRUNCATE:
                raise _truncated(&cops[i], 1, _p2p_name(cops, n), self.rank)
        return result

    cdef int _refuse_stuck_self_send(self, uint64_t nbytes) except -1:
        """A blocking send to this rank itself runs alone (the sends and receives
        queued before it would have taken it along): if it does not fit the free room
        of its channel now it can never complete, as nothing receives it meanwhile."""
        cdef int64_t room = sc_p2p_self_room(self.c)
        if <int64_t>nbytes <= room:
            return 0
        if nbytes > self._message_room:
            why = f"it does not fit the channel ({self._message_room} bytes)"
        else:
            why = (f"the channel has room for {max(room, 0)} bytes now (earlier messages to "
                   f"this rank itself, not received yet, hold the rest)")
        raise ValueError(
            f"send on rank {self.rank}: a blocking send of {nbytes} bytes to this rank "
            f"itself can never complete: {why} and nothing can receive it while it waits; "
            f"send it with async_op=True and then recv it, or use sendrecv")

    def close(self, bint failed=False):
        """Leave the job.  A call running in another thread is asked to give up
        (ClosedError there) and waited for; a call of this very thread (close() from a
        signal handler) is left to finish giving up, and detaches on its way out."""
        if self.c == NULL:
            return
        if not self._active:
            if not failed:
                self._closing = 1       # the queued calls run first; no new ones
                try:
                    self._drain()
                except BaseException:
                    self._closing = 0
                    raise
            if not self._active:        # (a signal handler may have closed it meanwhile)
                self._detach(failed)
            return
        sc_request_close(self.c)
        self._close_failed = self._close_failed or failed
        self._close_pending = 1
        if self._owner == PyThread_get_thread_ident():
            return
        while self.c != NULL:       # the running call detaches as it leaves
            with nogil:
                usleep(1000)

    cdef void _detach(self, bint failed):
        """Leave the job: the progress thread ends first (its queued calls give up at
        once when `failed`), then the attachment is freed."""
        if self.c == NULL:
            return
        self._closing = 1
        cdef sc_progress *collectives = self.lanes[COLLECTIVES]
        cdef sc_progress *messages = self.lanes[MESSAGES]
        if collectives != NULL or messages != NULL:
            if failed:
                sc_request_close(self.c)
            with nogil:
                sc_progress_stop(collectives)
                sc_progress_stop(messages)
            try:
                self._resolve()
            except BaseException:
                pass    # (settling only builds exceptions; nothing to undo)
        sc_detach(self.c, failed)
        self.c = NULL

    @property
    def closed(self):
        return self.c == NULL

    @property
    def in_call(self):
        """Whether a call of some thread is inside the engine now."""
        return bool(self._active)

    def __dealloc__(self):
        if self.c != NULL:
            if self.lanes[0] != NULL or self.lanes[1] != NULL:
                sc_request_close(self.c)    # idle: a busy engine is never garbage (_BUSY)
                sc_progress_stop(self.lanes[0])
                sc_progress_stop(self.lanes[1])
            sc_detach(self.c, 1)
            self.c = NULL
        sc_progress_free(self.lanes[0])
        sc_progress_free(self.lanes[1])
        self.lanes[0] = self.lanes[1] = NULL
        free(self._sym)
        self._sym = NULL


include "_work.pxi"


# The call record's fields in C order, then the pseudo-field SC_FIELD_SEQUENCE.
CALL_FIELDS = ("collective", "count", "dtype", "op", "root", "algorithm",
               "x's symmetric buffer", "out's symmetric buffer", "sequence")
# The C enums under the names the Python side uses: shmcoll.h is their one source,
# shmcoll.collectives and the algorithm modules read them from here.
COLLECTIVE_CODES = {"barrier": SC_COLL_BARRIER, "allreduce": SC_COLL_ALLREDUCE,
                    "reduce_scatter": SC_COLL_REDUCE_SCATTER, "allgather": SC_COLL_ALLGATHER,
                    "broadcast": SC_COLL_BROADCAST, "reduce": SC_COLL_REDUCE,
                    "gather": SC_COLL_GATHER, "scatter": SC_COLL_SCATTER,
                    "alltoall": SC_COLL_ALLTOALL, "alltoallv": SC_COLL_ALLTOALLV}
COLLECTIVE_NAMES = {code: name for name, code in COLLECTIVE_CODES.items()}
SCHEDULE_CODES = {"ring": SC_ALGO_RING, "direct": SC_ALGO_DIRECT,
                  "direct_two_shot": SC_ALGO_DIRECT_TWO_SHOT, "tree": SC_ALGO_TREE,
                  "rhd_doubling": SC_ALGO_RHD_DOUBLING, "rhd_halving": SC_ALGO_RHD_HALVING,
                  "naive": SC_ALGO_NAIVE, "bruck": SC_ALGO_BRUCK,
                  "symmetric": SC_ALGO_SYMMETRIC,
                  "symmetric_two_shot": SC_ALGO_SYMMETRIC_TWO_SHOT,
                  "cma": SC_ALGO_CMA, "cma_two_shot": SC_ALGO_CMA_TWO_SHOT,
                  "direct_inline": SC_ALGO_DIRECT_INLINE, "direct_eager": SC_ALGO_DIRECT_EAGER}
# The most bytes of x an inline call carries in its call record, and an eager call in
# its part buffer beside it (algorithms.direct).
INLINE_BYTES = SC_INLINE_BYTES
EAGER_BYTES = SC_EAGER_BYTES
# Symmetric decisions by where out lies (Engine._symmetric_choice).
SYMMETRIC_OUT_CASES = {"plain": SYM_OUT_PLAIN, "symmetric": SYM_OUT_SYMMETRIC,
                       "in place": SYM_IN_PLACE}
assert len(COLLECTIVE_CODES) == SC_NCOLLECTIVES - 1 and len(SCHEDULE_CODES) == SC_NALGOS


ANY_TAG = SC_ANY_TAG


cdef str _work_name(sc_work *w):
    """The name of a work's call: its collective, or send / recv / sendrecv."""
    if w.args.collective != SC_WORK_P2P:
        return COLLECTIVE_NAMES[w.args.collective]
    return _p2p_name(w.ops, w.nops)


cdef inline int _lane_of(const sc_work *w) noexcept:
    """The queue a work goes on (Engine.lanes)."""
    return MESSAGES if w.args.collective == SC_WORK_P2P else COLLECTIVES


cdef str _p2p_name(sc_p2p_op *ops, int n):
    if n == 2:
        return "sendrecv"
    return "send" if ops[0].kind == SC_P2P_SEND else "recv"


cdef object _truncated(sc_p2p_op *ops, int n, str what, int rank):
    """The MismatchError of a receive whose message had another size or type."""
    cdef int i
    for i in range(n):
        if ops[i].status == SC_ETRUNCATE:
            mine = f"{ops[i].bytes} bytes of {_describe('dtype', ops[i].dtype)}"
            theirs = f"{ops[i].got_bytes} bytes of {_describe('dtype', ops[i].got_dtype)}"
            field = "count" if ops[i].bytes != ops[i].got_bytes else "dtype"
            return MismatchError(
                f"{what} on rank {rank}: the message from rank {ops[i].peer} with tag "
                f"{ops[i].got_tag} holds {theirs}, the receive expected {mine}; the message "
                f"was discarded (the communicator stays usable)", field, (rank, ops[i].peer))
    return MismatchError(f"{what} on rank {rank}: a message did not match its receive")


def implements(collective, int algo):
    """Whether the engine has a schedule for (collective name, schedule code)."""
    return bool(sc_implements(COLLECTIVE_CODES[collective], algo))


def implemented():
    """{(collective name, schedule code)} of every schedule the engine runs (sc_run.c)
    that the cost model chooses among (alltoallv has its one schedule, run as is)."""
    return {(name, code) for name, coll in COLLECTIVE_CODES.items() if name != "alltoallv"
            for code in range(SC_NALGOS) if sc_implements(coll, code)}


def _describe(field, value):
    """A call record's value as text; a value no rank could have written (a corrupt
    record) is shown as it is, never raised on."""
    if field.endswith("symmetric buffer"):
        if value < 0:
            return "not in one"
        rows = "each rank's own row of " if value & SYM_ROWS else ""
        value &= ~SYM_ROWS
        return (f"{rows}allocation #{value >> SYM_OFFSET_BITS} at byte "
                f"{value & ((1 << SYM_OFFSET_BITS) - 1)}")
    if value < 0:
        return "none"
    try:
        if field == "collective":
            return COLLECTIVE_NAMES[value]
        if field == "dtype":
            # (a hashed copy code is named only where its dtype was used)
            return _NAMES.get(value) or _TYPE_NAMES.get(value) or (
                "bool" if value == _COPY_BOOL else
                f"one this process never passed (type code {value})")
        if field == "op":
            from shmcoll.ops import ReduceOp
            return ReduceOp.from_code(value).value
        if field == "algorithm":
            from shmcoll.tuning.algorithms import name_of_code
            return name_of_code(value)
        if field == "sequence":
            return f"call #{value}"
    except (KeyError, IndexError, ValueError, TypeError):
        return f"{value} (not a valid {field})"
    return str(value)


cdef object _mismatch_error(sc_comm *c, str what, int rank):
    cdef int64_t info[6]
    sc_mismatch_info(c, info)
    field = CALL_FIELDS[info[0]] if 0 <= info[0] < len(CALL_FIELDS) else "call"
    a, b = info[1], info[2]
    mine, theirs = _describe(field, info[3]), _describe(field, info[4])
    from shmcoll.collectives import BY_CODE
    copies = info[5] in BY_CODE and not BY_CODE[info[5]].reducing
    unit = " (bytes)" if field == "count" and copies else ""
    if field == "sequence":
        return MismatchError(f"{what} on rank {rank}: rank {b} ran ahead of rank {a}: its record "
                             f"of {mine} was overwritten by {theirs}; the communicator is "
                             f"unusable", field, (a, b))
    return MismatchError(f"{what} on rank {rank}: ranks {a} and {b} made different calls: "
                         f"{field}{unit} {mine} on rank {a}, {theirs} on rank {b}; "
                         f"the communicator is unusable", field, (a, b))


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
