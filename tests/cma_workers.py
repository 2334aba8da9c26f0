"""Rank functions of test_cma: collectives on ordinary arrays read by peers with
cross-memory attach (module level, so spawned ranks import them)."""
import ctypes
import errno
import os
import platform
import time

import numpy as np

import shmcoll
from shmcoll.errors import MismatchError
from symmetric_workers import SIZES, rank_values, rooted_reuse

PR_SET_DUMPABLE = 4
CAP_SYS_PTRACE = 19
SYSCALLS = {"x86_64": (125, 126), "aarch64": (90, 91)}      # capget, capset
_CAP_VERSION_3 = 0x20080522
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
# The audit architecture and process_vm_writev's number, for a seccomp filter.
WRITEV = {"x86_64": (0xC000003E, 311), "aarch64": (0xC00000B7, 271)}


class _Insn(ctypes.Structure):      # struct sock_filter
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):      # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def _deny_cross_memory_writes():
    """A seccomp filter on this thread (the one that creates communicators): its
    process_vm_writev calls fail with EPERM, every other call (process_vm_readv
    too) goes through, as a container's profile that allows only reads would have
    it."""
    arch, writev = WRITEV[platform.machine()]
    load, jump_eq, ret = 0x20, 0x15, 0x06       # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    program = (_Insn * 6)((load, 0, 0, 4),                  # seccomp_data.arch
                          (jump_eq, 0, 3, arch),
                          (load, 0, 0, 0),                  # seccomp_data.nr
                          (jump_eq, 0, 1, writev),
                          (ret, 0, 0, 0x00050000 | errno.EPERM),    # SECCOMP_RET_ERRNO
                          (ret, 0, 0, 0x7FFF0000))                  # SECCOMP_RET_ALLOW
    libc = ctypes.CDLL(None, use_errno=True)
    if (libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                       ctypes.byref(_Prog(len(program), program)), 0, 0) != 0):
        raise OSError(ctypes.get_errno(), "installing the seccomp filter")


def _moves_own_memory():
    """(read, write): whether process_vm_readv and process_vm_writev of a word of this
    process's own memory succeed."""
    libc = ctypes.CDLL(None, use_errno=True)
    word, other = ctypes.c_uint64(7), ctypes.c_uint64(0)
    here = (ctypes.c_void_p * 2)(ctypes.addressof(other), 8)
    there = (ctypes.c_void_p * 2)(ctypes.addressof(word), 8)
    return tuple(getattr(libc, call)(os.getpid(), here, 1, there, 1, 0) == 8
                 for call in ("process_vm_readv", "process_vm_writev"))


def _drop_ptrace_capability():
    """This process gives up CAP_SYS_PTRACE (root keeps it otherwise, and with it may
    read any process): as an ordinary user it may read only dumpable ones of its own."""
    capget, capset = SYSCALLS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()      # {effective, permitted, inheritable} x 2 words
    if libc.syscall(capget, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for word in (0, 1):                 # effective and permitted of the low 32 caps
        data[word] &= ~(1 << CAP_SYS_PTRACE)
    if libc.syscall(capset, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def every_collective(comm, dtype, op, algo="cma"):
    """{(collective, n, variant): result} of every cma collective on ordinary arrays
    (in place, at an offset into a larger array, and a symmetric x on rank 0 only)."""
    P, r = comm.world_size, comm.rank
    root = P - 1
    got = {}
    for n in SIZES:
        x = rank_values(r, n, dtype)
        got["allreduce", n, "plain"] = comm.allreduce(x, op=op, algo=algo)
        y = x.copy()
        comm.allreduce(y, out=y, op=op, algo=algo)
        got["allreduce", n, "in place"] = y
        wide = np.zeros(n + 3, dtype)
        wide[3:] = x
        got["allreduce", n, "view"] = comm.allreduce(wide[3:], op=op, algo=algo)
        if r == 0:      # an array of a symmetric allocation is an ordinary one to cma
            sym = comm.empty(n, dtype)
        else:
            comm.empty(n, dtype)
            sym = np.empty(n, dtype)
        sym[...] = x
        got["allreduce", n, "symmetric on rank 0"] = comm.allreduce(sym, op=op, algo=algo)
        big = rank_values(r, n * P, dtype)
        got["reduce_scatter", n, "plain"] = comm.reduce_scatter(big, op=op, algo=algo)
        comm.reduce_scatter(big, out=big[r * n:(r + 1) * n], op=op, algo=algo)
        got["reduce_scatter", n, "in place"] = big[r * n:(r + 1) * n].copy()
        got["reduce", n, "plain"] = comm.reduce(x, op=op, root=root, algo=algo)
        z = x.copy()
        got["reduce", n, "in place"] = comm.reduce(z, out=z, op=op, root=root, algo=algo)
        got["allgather", n, "plain"] = comm.allgather(x, algo=algo)
        rows = np.empty((P, n), dtype)
        rows[r] = x
        got["allgather", n, "in place"] = comm.allgather(rows[r], out=rows, algo=algo).copy()
        got["gather", n, "plain"] = comm.gather(x, root=root, algo=algo)
        gathered = np.full((P, n), 7, dtype)
        gathered[r] = x
        got["gather", n, "in place"] = comm.gather(gathered[r], out=gathered, root=root,
                                                   algo=algo)
        b = x.copy()
        comm.broadcast(b, root=root, algo=algo)
        got["broadcast", n, "plain"] = b
        # the root pushes the head of every receiver's copy: into a view at an odd offset
        wide[3:] = x
        comm.broadcast(wide[3:], root=root, algo=algo)
        got["broadcast", n, "view"] = wide[3:].copy()
    return got


def variants_taken(comm, dtype):
    """What algo='cma' runs for the AllReduce sizes of every_collective."""
    itemsize = np.dtype(dtype).itemsize
    return {comm.algorithm_for("allreduce", n * itemsize, algo="cma") for n in SIZES if n}


def agreement(comm):
    return comm.cross_memory


def declines(comm, how):
    """A child communicator where rank 1 declines (SHMCOLL_CMA=off), cannot be read
    (not dumpable) or may read its peers and not write into them (a seccomp filter):
    every rank learns the job has no cross-memory attach, and an explicit algo='cma'
    is refused everywhere before anything runs."""
    if how == "off" and comm.rank == 1:
        os.environ["SHMCOLL_CMA"] = "off"
    if how == "not dumpable":
        _drop_ptrace_capability()
        if comm.rank == 1:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if how == "writes denied" and comm.rank == 1:
        _deny_cross_memory_writes()
        assert _moves_own_memory() == (True, False)
    child = comm.split(0)
    try:
        x = np.ones(1 << 16, np.float32)
        try:
            child.allreduce(x, algo="cma")
            refused = None
        except ValueError as e:
            refused = str(e)
        return child.cross_memory, refused, float(child.allreduce(x)[0])
    finally:
        child.close()


def reuse_at_once(comm, rounds):
    """Each rank rewrites its x right after every call, the last rank late every 7th:
    no peer may still be reading it (every result checked)."""
    P, r = comm.world_size, comm.rank
    n = 70001
    x, out = np.empty(n, np.float64), np.empty(n, np.float64)
    wrong = 0
    for k in range(rounds):
        x[:] = rank_values(r, n, np.float64, k)
        if r == P - 1 and k % 7 == 0:
            time.sleep(0.002)
        y = comm.allreduce(x, out=x if k % 2 else out, algo="cma")
        want = sum(rank_values(q, n, np.float64, k) for q in range(P))
        wrong += int(np.count_nonzero(y != want))
        x[:] = -1.0         # at once: a peer still reading would see it
        wrong += rooted_reuse(comm, x, k, "cma")
    return wrong


def two_shot_in_chunks(comm, n, rounds):
    """cma two-shot AllReduce of blocks several chunks long (each pushed as it is
    reduced, with no middle barrier), out of place and in place, the last rank late
    every other round: [(variant run, results wrong)]."""
    P, r = comm.world_size, comm.rank
    taken, wrong = set(), 0
    out = np.empty(n, np.float32)
    for k in range(rounds):
        x = rank_values(r, n, np.float32, k)
        want = sum(rank_values(q, n, np.float32, k) for q in range(P))
        if r == P - 1 and k % 2:
            time.sleep(0.003)
        taken.add(comm.algorithm_for("allreduce", x.nbytes, algo="cma"))
        wrong += int(np.count_nonzero(comm.allreduce(x, out=out, algo="cma") != want))
        comm.allreduce(x, out=x, algo="cma")
        wrong += int(np.count_nonzero(x != want))
    return taken, wrong


def nonblocking(comm):
    x = rank_values(comm.rank, 70001, np.float32)
    works = [comm.allreduce(x, out=x, algo="cma", async_op=True),
             comm.allgather(rank_values(comm.rank, 999, np.float32), algo="cma", async_op=True)]
    gathered = works[1].wait()
    works[0].wait()
    return x.copy(), gathered


def mismatched(comm):
    """Rank 0 reads by cross-memory attach, the others through channels."""
    try:
        comm.allreduce(np.ones(1 << 16, np.float32), algo="cma" if comm.rank == 0 else "ring")
        return "ok"
    except MismatchError as e:
        return f"MismatchError: {e}"


def launch(fn, world, *args):
    return shmcoll.launch(fn, world, args=args, timeout=60)
