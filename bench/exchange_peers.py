"""All-to-all and point-to-point against the peers, one JSON line per size.

    python bench/exchange_peers.py shmcoll alltoall -np 4
    mpirun -np 4 <python with mpi4py> bench/exchange_peers.py mpi alltoall --label openmpi
    <python with torch> bench/exchange_peers.py gloo alltoall -np 4
    (the same with `latency` and `bandwidth`, at -np 2)

alltoall: float32, size = the bytes of x on each rank (P blocks), nccl-tests' time (the
max over ranks of the mean per call) and busbw = algbw x (P-1)/P.  latency and
bandwidth follow the OSU micro-benchmarks: latency is half the round trip of a
ping-pong; bandwidth is a window of 64 nonblocking sends of one size, then a one-byte
acknowledgement, as bytes per second.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M,16M"
WINDOW = 64


def parse_size(text):
    """shmcoll._core.sizes.parse_size's notation (the peers' Pythons lack shmcoll)."""
    text = text.strip().upper()
    for suffix, scale in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * scale)
    return int(text)


def iters_for(nbytes, iters):
    return iters or max(20, min(2000, int(2e8 / max(nbytes, 1))))


def emit(impl, test, P, nbytes, seconds, ok):
    if test == "alltoall":
        algbw = nbytes / seconds / 1e9
        extra = {"algbw_GBs": round(algbw, 3), "busbw_GBs": round(algbw * (P - 1) / P, 3)}
    elif test == "bandwidth":
        extra = {"bw_GBs": round(nbytes / seconds / 1e9, 3)}
    else:
        extra = {}
    print(json.dumps({"impl": impl, "test": test, "P": P, "bytes": nbytes,
                      "time_us": round(seconds * 1e6, 3), **extra, "ok": bool(ok)}), flush=True)


# -- what each implementation calls -------------------------------------------------------
class Ops:
    """rank, size, barrier(), max_time(t), alltoall(x, out), send/recv (blocking),
    isend/irecv (returning something with wait())."""


def shmcoll_ops(comm):
    ops = Ops()
    ops.rank, ops.size = comm.rank, comm.world_size
    ops.barrier = comm.barrier
    ops.max_time = lambda t: float(comm.allreduce(np.array([t]), op="max")[0])
    ops.alltoall = lambda x, out: comm.alltoall(x.reshape(comm.world_size, -1),
                                                out=out.reshape(comm.world_size, -1))
    ops.send = lambda x, dst: comm.send(x, dst)
    ops.recv = lambda out, src: comm.recv(out, src)
    ops.isend = lambda x, dst: comm.send(x, dst, async_op=True)
    ops.irecv = lambda out, src: comm.recv(out, src, async_op=True)
    return ops


def mpi_ops():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    ops = Ops()
    ops.rank, ops.size = comm.Get_rank(), comm.Get_size()
    ops.barrier = comm.Barrier
    ops.max_time = lambda t: comm.allreduce(t, op=MPI.MAX)
    ops.alltoall = lambda x, out: comm.Alltoall(x, out)
    ops.send = lambda x, dst: comm.Send(x, dst)
    ops.recv = lambda out, src: comm.Recv(out, src)
    ops.isend = lambda x, dst: comm.Isend(x, dst)
    ops.irecv = lambda out, src: comm.Irecv(out, src)
    return ops


def gloo_ops():
    import torch
    import torch.distributed as dist
    ops = Ops()
    ops.rank, ops.size = dist.get_rank(), dist.get_world_size()
    ops.barrier = dist.barrier

    def max_time(t):
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])
    ops.max_time = max_time
    ops.alltoall = lambda x, out: dist.all_to_all_single(out, x)
    ops.send = lambda x, dst: dist.send(x, dst)
    ops.recv = lambda out, src: dist.recv(out, src)
    ops.isend = lambda x, dst: dist.isend(x, dst)
    ops.irecv = lambda out, src: dist.irecv(out, src)
    return ops


# -- the measurements ---------------------------------------------------------------------
def alltoall(ops, sizes, iters, make):
    P = ops.size
    for nbytes in sizes:
        count = max(P, nbytes // 4 // P * P)
        x = make(np.full(count, float(ops.rank), np.float32))
        out = make(np.zeros(count, np.float32))
        n = iters_for(count * 4, iters)
        for _ in range(max(2, n // 10)):
            ops.alltoall(x, out)
        ops.barrier()
        start = time.perf_counter()
        for _ in range(n):
            ops.alltoall(x, out)
        seconds = ops.max_time((time.perf_counter() - start) / n)
        got = np.asarray(out).reshape(P, -1)[:, 0]
        if ops.rank == 0:
            emit(IMPL, "alltoall", P, count * 4, seconds, np.array_equal(got, np.arange(P)))


def latency(ops, sizes, iters, make):
    """OSU latency: half the round trip of a ping-pong between ranks 0 and 1."""
    for nbytes in sizes:
        buf, back = make(np.ones(nbytes, np.uint8)), make(np.zeros(nbytes, np.uint8))
        n = iters_for(nbytes, iters)
        ops.barrier()
        for i in range(n + max(2, n // 10)):
            if i == max(2, n // 10):
                start = time.perf_counter()
            if ops.rank == 0:
                ops.send(buf, 1)
                ops.recv(back, 1)
            elif ops.rank == 1:
                ops.recv(back, 0)
                ops.send(buf, 0)
        seconds = (time.perf_counter() - start) / n / 2
        if ops.rank == 0:
            emit(IMPL, "latency", 2, nbytes, seconds, int(np.asarray(back)[:1].sum()) == min(1, nbytes))


def bandwidth(ops, sizes, iters, make):
    """OSU bandwidth: a window of nonblocking sends, then a one-byte acknowledgement."""
    ack = make(np.zeros(1, np.uint8))
    for nbytes in sizes:
        bufs = [make(np.ones(nbytes, np.uint8)) for _ in range(WINDOW)]
        n = max(3, iters_for(nbytes * WINDOW, iters) // 4)
        ops.barrier()
        for i in range(n + 2):
            if i == 2:
                start = time.perf_counter()
            if ops.rank == 0:
                for w in [ops.isend(b, 1) for b in bufs]:
                    w.wait()
                ops.recv(ack, 1)
            elif ops.rank == 1:
                for w in [ops.irecv(b, 0) for b in bufs]:
                    w.wait()
                ops.send(ack, 0)
        seconds = (time.perf_counter() - start) / n / WINDOW
        if ops.rank == 0:
            emit(IMPL, "bandwidth", 2, nbytes, seconds, True)


TESTS = {"alltoall": alltoall, "latency": latency, "bandwidth": bandwidth}


def run(ops, args, make=lambda a: a):
    global IMPL
    IMPL = args.label or args.impl
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    TESTS[args.test](ops, sizes, args.iters, make)


def shmcoll_rank(comm, args):
    run(shmcoll_ops(comm), args)


def gloo_rank(rank, P, args, port):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=P)
    run(gloo_ops(), args, make=torch.from_numpy)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("impl", choices=["shmcoll", "mpi", "gloo"])
    ap.add_argument("test", choices=list(TESTS))
    ap.add_argument("-np", type=int, default=2)
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.impl == "mpi":
        run(mpi_ops(), args)
    elif args.impl == "gloo":
        import random
        import torch.multiprocessing as tmp
        tmp.spawn(gloo_rank, args=(args.np, args, random.randint(20000, 60000)), nprocs=args.np)
    else:
        import shmcoll
        shmcoll.launch(shmcoll_rank, args.np, args=(args,))


IMPL = "shmcoll"
if __name__ == "__main__":
    sys.exit(main())
