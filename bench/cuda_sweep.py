"""GPU AllReduce sweep: shmcoll's CUDA IPC path beside the device's copy bandwidth and
NCCL, in one run.  Needs CuPy and a GPU; every rank uses the GPU it finds (several
ranks share one GPU when there is one).

    python bench/cuda_sweep.py -np 2 -b 8 -e 1G -f 4 [--no-nccl]

Columns: size, shmcoll's time, algbw and busbw (nccl-tests conventions: busbw =
algbw x 2(P-1)/P), busbw as a fraction of the copy bandwidth (bytes read + written
per second by a device-to-device copy of the largest size), and NCCL's time where
NCCL accepts the ranks (torch.distributed; it refuses two ranks on one GPU, and the
reason is printed instead).
"""
import argparse
import os
import sys
import time

import numpy as np


def copy_bandwidth(nbytes):
    """Bytes read + written per second by a device-to-device copy (median of 10)."""
    import cupy
    a = cupy.empty(nbytes, cupy.uint8)
    b = cupy.empty_like(a)
    times = []
    for _ in range(12):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        b[...] = a
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * nbytes / float(np.median(times[2:]))


def shmcoll_worker(comm, sizes, iters):
    import cupy
    out = []
    for n in sizes:
        x = cupy.ones(max(1, n // 4), cupy.float32)
        reps = iters or max(5, min(200, int(2e9 // max(n, 1))))
        for _ in range(3):
            comm.allreduce(x)
        comm.synchronize()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.allreduce(x)
        comm.synchronize()
        seconds = (time.perf_counter() - t0) / reps
        worst = float(comm.allreduce(np.array([seconds]), op="max")[0])
        ok = bool((comm.allreduce(x) == comm.world_size).all())
        out.append((x.nbytes, worst, comm.algorithm_for("allreduce", x.nbytes, device=True), ok))
    return out if comm.rank == 0 else None


def nccl_worker(rank, world, sizes, port, queue):
    try:
        import torch
        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("nccl", rank=rank, world_size=world)
        rows = []
        for n in sizes:
            x = torch.ones(max(1, n // 4), device="cuda")
            reps = max(5, min(200, int(2e9 // max(n, 1))))
            for _ in range(3):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            rows.append((time.perf_counter() - t0) / reps)
        dist.destroy_process_group()
        queue.put((rank, rows))
    except Exception as e:  # noqa: BLE001 - reported, not raised: NCCL may refuse
        queue.put((rank, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))


def nccl_times(world, sizes):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=nccl_worker, args=(r, world, sizes, port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        try:
            rank, rows = queue.get(timeout=300)
        except Exception:  # noqa: BLE001
            break
        results[rank] = rows
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    first = results.get(0, "no answer within 300 s")
    return first


def main(argv=None):
    from shmcoll.tools.harness import size_sweep
    from shmcoll._core.sizes import parse_size
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", type=int, default=2)
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=parse_size("1G"))
    p.add_argument("-f", type=float, default=4)
    p.add_argument("-n", "--iters", type=int, default=0)
    p.add_argument("--no-nccl", action="store_true")
    opts = p.parse_args(argv)
    import shmcoll
    sizes = size_sweep(opts.b, opts.e, opts.f)
    copy = copy_bandwidth(max(sizes))
    rows = shmcoll.launch(shmcoll_worker, opts.np, args=(sizes, opts.iters))[0]
    nccl = "skipped" if opts.no_nccl else nccl_times(opts.np, sizes)
    factor = 2 * (opts.np - 1) / opts.np
    print(f"# allreduce float32, {opts.np} ranks; device copy bandwidth {copy / 1e9:.1f} GB/s "
          f"(read + written)")
    if isinstance(nccl, str):
        print(f"# NCCL: {nccl}")
    print(f"# {'size':>10} {'time us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'bus/copy':>8} "
          f"{'NCCL us':>10}  algorithm")
    for i, (n, seconds, algo, ok) in enumerate(rows):
        algbw = n / seconds
        ref = f"{nccl[i] * 1e6:>10.2f}" if isinstance(nccl, list) else f"{'-':>10}"
        print(f"  {n:>10} {seconds * 1e6:>10.2f} {algbw / 1e9:>10.2f} {algbw * factor / 1e9:>10.2f} "
              f"{algbw * factor / copy:>8.1%} {ref}  {algo}{'' if ok else '  WRONG'}")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
