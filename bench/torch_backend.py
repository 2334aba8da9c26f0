"""torch.distributed on the "shmcoll" backend beside "gloo": the same script, the same
seed, the backends interleaved run by run, medians over the runs.

    python bench/torch_backend.py collectives -np 2 4 --sizes 8 1K 32K 1M 64M
    python bench/torch_backend.py ddp -np 2 4 --repeats 3 --json ddp.json

collectives: dist.all_reduce (or --collective all_gather_into_tensor,
reduce_scatter_tensor, broadcast) on float32 tensors, in nccl-tests' columns: time is
the mean of back-to-back calls on rank 0 after a barrier, algbw = bytes / time, busbw
= algbw x the collective's bus factor.

ddp: a DistributedDataParallel training step of an MLP (12.6 M parameters, batch 8
per rank, SGD) or, with --model recommender, of an embedding-bag model (12.8 M
parameters, dense gradients: little computation per byte moved): the median step,
the median step under no_sync() (the same step without communication), and the share
of the step the communication costs, (step - no_sync) / step.  Every run also checks that the ranks'
parameters end bitwise equal and reports the largest difference between the
backends' loss curves (same data, same seed).

One BLAS/OpenMP thread per rank (as torchrun sets), ranks started with spawn, a
torch FileStore for the rendezvous.
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import multiprocessing as mp  # noqa: E402

BUS_FACTORS = {"all_reduce": lambda p: 2 * (p - 1) / p, "broadcast": lambda p: 1.0,
               "all_gather_into_tensor": lambda p: (p - 1) / p,
               "reduce_scatter_tensor": lambda p: (p - 1) / p}


def _parse_size(text):
    from shmcoll._core.sizes import parse_size
    return parse_size(text)


# -- in each rank ------------------------------------------------------------
def _init(backend, store_path, rank, world):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if backend == "shmcoll":
        import shmcoll.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend, store=dist.FileStore(store_path, world),
                            rank=rank, world_size=world)
    return torch, dist


def _call(torch, dist, collective, nbytes, world):
    n = max(1, nbytes // 4)
    if collective == "all_reduce":
        x = torch.ones(n)
        return lambda: dist.all_reduce(x)
    if collective == "broadcast":
        x = torch.ones(n)
        return lambda: dist.broadcast(x, src=0)
    if collective == "all_gather_into_tensor":
        x, out = torch.ones(max(1, n // world)), torch.empty(max(1, n // world) * world)
        return lambda: dist.all_gather_into_tensor(out, x)
    if collective == "reduce_scatter_tensor":
        x, out = torch.ones(max(1, n // world) * world), torch.empty(max(1, n // world))
        return lambda: dist.reduce_scatter_tensor(out, x)
    raise ValueError(f"unknown collective {collective}")


def _mean_call_seconds(torch, dist, fn, budget=0.25):
    fn()
    fn()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    once = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(once, op=dist.ReduceOp.MAX)     # every rank runs the same count
    iters = int(min(1000, max(3, budget / max(once.item(), 1e-7))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _collectives_rank(rank, world, backend, store_path, collective, sizes, queue):
    torch, dist = _init(backend, store_path, rank, world)
    rows = []
    for nbytes in sizes:
        seconds = _mean_call_seconds(torch, dist, _call(torch, dist, collective, nbytes, world))
        rows.append((nbytes, seconds))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _model(torch, kind):
    """(model, input of one step of `batch` rows): an MLP of 12.6 M parameters, or a
    recommender-style one of 12.8 M whose dense embedding gradients make every step
    move 51 MB for little computation."""
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "mlp":
        return (nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 2048),
                              nn.ReLU(), nn.Linear(2048, 10)),
                lambda g, steps, batch: torch.randn(steps, batch, 1024, generator=g))

    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.EmbeddingBag(200_000, 64, mode="sum")
            self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, ids):
            return self.head(self.items(ids))
    return (Recommender(),
            lambda g, steps, batch: torch.randint(0, 200_000, (steps, batch, 16), generator=g))


def _ddp_rank(rank, world, backend, store_path, steps, batch, kind, queue):
    torch, dist = _init(backend, store_path, rank, world)
    module, inputs = _model(torch, kind)
    model = torch.nn.parallel.DistributedDataParallel(module)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + rank)
    x = inputs(data, steps, batch)
    y = torch.randint(0, 10, (steps, batch), generator=data)

    def step(i):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i]), y[i])
        loss.backward()
        opt.step()
        return loss.item()

    losses, times = [], []
    for i in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - t0)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    nosync = []
    with model.no_sync():               # the same steps, no communication
        for i in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()
            nosync.append(time.perf_counter() - t0)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        warm = max(1, steps // 5)
        queue.put({"params": params, "losses": losses,
                   "step_s": statistics.median(times[warm:]),
                   "nosync_s": statistics.median(nosync[warm:]),
                   "replicas_equal": len(set(digests)) == 1})
    dist.destroy_process_group()


# -- the parent ----------------------------------------------------------------
def _run(target, world, backend, *args, timeout=900):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=target, args=(r, world, backend, store) + args + (queue,))
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            result = queue.get(timeout=timeout)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
        failed = [p.exitcode for p in procs if p.exitcode]
        if failed:
            raise RuntimeError(f"{backend} P={world}: ranks exited with {failed}")
    return result


def _fmt_size(n):
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def collectives(opts):
    sizes = [_parse_size(s) for s in opts.sizes]
    rows = []
    for world in opts.worlds:
        runs = {b: [] for b in opts.backends}
        for _ in range(opts.repeats):
            for backend in opts.backends:
                runs[backend].append(_run(_collectives_rank, world, backend,
                                          opts.collective, sizes))
        factor = BUS_FACTORS[opts.collective](world)
        print(f"\n# {opts.collective}, float32, P={world}: medians of {opts.repeats} runs "
              f"(nccl-tests columns; speedup = time of {opts.backends[0]} / time of "
              f"{opts.backends[-1]})")
        print(f"{'size':>8} {'count':>10} " + " ".join(
            f"{b + ' us':>12} {'busbw':>7}" for b in opts.backends) + f" {'speedup':>8}")
        for i, nbytes in enumerate(sizes):
            us = {b: statistics.median(r[i][1] for r in runs[b]) * 1e6 for b in opts.backends}
            cells = []
            for b in opts.backends:
                busbw = nbytes / (us[b] * 1e-6) / 1e9 * factor
                cells.append(f"{us[b]:12.1f} {busbw:7.2f}")
                rows.append({"collective": opts.collective, "world": world, "bytes": nbytes,
                             "backend": b, "time_us": us[b], "busbw_GBps": busbw})
            ratio = us[opts.backends[0]] / us[opts.backends[-1]]
            print(f"{_fmt_size(nbytes):>8} {max(1, nbytes // 4):>10} " + " ".join(cells)
                  + f" {ratio:7.1f}x")
    return rows


def ddp(opts):
    rows = []
    for world in opts.worlds:
        runs = {b: [] for b in opts.backends}
        for _ in range(opts.repeats):
            for backend in opts.backends:
                runs[backend].append(_run(_ddp_rank, world, backend, opts.steps, opts.batch,
                                          opts.model))
        first = runs[opts.backends[0]][0]
        print(f"\n# DDP step, {opts.model} of {first['params'] / 1e6:.1f} M parameters, batch "
              f"{opts.batch} per rank, P={world}: medians over {opts.repeats} runs")
        print(f"{'backend':>8} {'step ms':>8} {'no_sync ms':>10} {'comm share':>10} "
              f"{'replicas equal':>14} {'loss diff vs ' + opts.backends[0]:>18}")
        for b in opts.backends:
            step = statistics.median(r["step_s"] for r in runs[b]) * 1e3
            nosync = statistics.median(r["nosync_s"] for r in runs[b]) * 1e3
            equal = all(r["replicas_equal"] for r in runs[b])
            diff = max(abs(a - c) for r in runs[b] for a, c in zip(r["losses"], first["losses"]))
            share = max(0.0, (step - nosync) / step)
            print(f"{b:>8} {step:8.1f} {nosync:10.1f} {share:10.0%} {str(equal):>14} "
                  f"{diff:18.2e}")
            rows.append({"world": world, "backend": b, "step_ms": step, "nosync_ms": nosync,
                         "comm_share": share, "replicas_equal": equal, "loss_diff": diff,
                         "params": first["params"], "model": opts.model})
        base = statistics.median(r["step_s"] for r in runs[opts.backends[0]])
        last = statistics.median(r["step_s"] for r in runs[opts.backends[-1]])
        print(f"step time {opts.backends[0]} / {opts.backends[-1]}: {base / last:.2f}x")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["collectives", "ddp"])
    ap.add_argument("-np", dest="worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--backends", nargs="+", default=["gloo", "shmcoll"])
    ap.add_argument("--collective", default="all_reduce", choices=sorted(BUS_FACTORS))
    ap.add_argument("--sizes", nargs="+",
                    default=["8", "1K", "32K", "256K", "1M", "4M", "16M", "64M"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", choices=["mlp", "recommender"], default="mlp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    opts = ap.parse_args(argv)
    rows = collectives(opts) if opts.mode == "collectives" else ddp(opts)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
