"""`shmcoll perf`: an nccl-tests style throughput tester, and the timing core that the
benchmark suite shares.

Conventions (nccl-tests): size is the bytes of the full vector (allreduce, reduce,
broadcast: x; reduce_scatter: x on each rank; allgather, gather: the gathered
output; scatter: the root's x); time is the max over ranks of the mean per-call
time; algbw = size / time; busbw = algbw x 2(P-1)/P for allreduce, x 1 for broadcast
and reduce, x (P-1)/P for the others.  Broadcast is always in place, so its two
columns time the same call.
"""
import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

REDUCING = ("allreduce", "reduce_scatter", "reduce")
BLOCKED = ("reduce_scatter", "allgather", "gather", "scatter")   # size = world x a block


def bus_factor(collective, world):
    if world == 1 or collective in ("broadcast", "reduce"):
        return 1.0
    if collective == "allreduce":
        return 2.0 * (world - 1) / world
    return (world - 1) / world


def size_sweep(minbytes, maxbytes, factor):
    if minbytes < 0 or maxbytes < minbytes:
        raise ValueError(f"need 0 <= MIN <= MAX, got {minbytes} and {maxbytes}")
    if factor <= 1 and minbytes != maxbytes:
        raise ValueError(f"step factor must be > 1, got {factor}")
    sizes, s = [], minbytes
    while True:
        sizes.append(s)
        nxt = max(int(s * factor), s + 1)
        if nxt > maxbytes or factor <= 1:
            return sizes
        s = nxt


def auto_iters(nbytes):
    """About 0.1-0.2 s of traffic per size, bounded to [5, 2000] calls."""
    return max(5, min(2000, int(5e7 // max(nbytes, 1))))


def time_calls(comm, call, iters, warmup):
    """Seconds per call: the max over ranks of each rank's mean over `iters` calls.

    Every rank must call this with the same iters/warmup; it synchronises the ranks
    with a barrier before the timed loop, and gathers the per-rank means after it.
    """
    for _ in range(warmup):
        call()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    comm.synchronize()      # device arrays: until the GPU has finished them
    mean = (time.perf_counter() - t0) / max(iters, 1)
    return float(comm.allgather(np.array([mean]))[:, 0].max())


CHECK_BLOCK = 1 << 20   # elements compared at a time: the check needs O(P x block) memory


def copy_reference_seconds(nbytes, budget=0.02):
    """Median seconds of one memcpy of `nbytes` on this core, measured now.

    Benchmarks divide by it: a slower or busier machine slows the copy and the
    collective alike, so the ratio drifts less between runs than either time.
    """
    src = np.ones(max(nbytes, 8), np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    calls = max(1, min(10000, int(budget * 5e9 / max(nbytes, 1) / 7)))
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            np.copyto(dst, src)
        samples.append((time.perf_counter() - t0) / calls)
    return float(np.median(samples))


def rank_input(rank, count, dtype, start=0):
    """Elements [start, start+count) of a rank's input: varied small integers, exactly
    representable in every dtype, so that sums check exactly."""
    i = np.arange(start, start + count, dtype=np.int64)
    return ((i * 7 + rank * 3) % 11 + 1).astype(dtype)


def fill_input(x, rank):
    """x[...] = rank_input(rank, x.size), a block at a time (no full-size temporaries)."""
    flat = x.reshape(-1)
    for s in range(0, flat.size, CHECK_BLOCK):
        n = min(CHECK_BLOCK, flat.size - s)
        flat[s:s + n] = rank_input(rank, n, x.dtype, s)


_REDUCERS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
             "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
             "bxor": np.bitwise_xor}


def reduced_block(world, start, count, dtype, op):
    """Elements [start, start+count) of the reduction of every rank's input, by numpy
    (floats in float64 and compared with a tolerance; integers wrap like the engine)."""
    xs = np.stack([rank_input(r, count, dtype, start) for r in range(world)])
    integer = np.dtype(dtype).kind in "iu"
    acc = xs if integer else xs.astype(np.float64)
    res = _REDUCERS[op].reduce(acc, axis=0, dtype=acc.dtype)
    if op == "avg":
        res = res // world if integer else res / world
    return res.astype(dtype)


def count_wrong(got, want):
    if np.dtype(want.dtype).kind in "iu":
        return int(np.count_nonzero(got != want))
    rtol = 1e-2 if got.dtype.itemsize == 2 else 1e-5
    return int(np.count_nonzero(~np.isclose(got.astype(np.float64), want.astype(np.float64),
                                            rtol=rtol, equal_nan=True)))


@dataclass
class Row:
    collective: str
    world: int
    size: int
    count: int
    dtype: str
    op: str
    algo: str
    inplace: bool
    time_us: float
    algbw_GBs: float
    busbw_GBs: float
    wrong: int


class Case:
    """One collective at one size on this rank: buffers, the call, and its check."""

    def __init__(self, comm, collective, nbytes, dtype, op, algo, root=0, device=False):
        self.comm, self.collective, self.op, self.algo = comm, collective, op, algo
        self.device = device
        P, itemsize = comm.world_size, np.dtype(dtype).itemsize
        count = nbytes // itemsize
        if collective in BLOCKED:
            count -= count % P
        self.count, self.dtype, self.root = count, np.dtype(dtype), root
        block = count // P
        shapes = {   # (x, out) on this rank
            "allreduce": ((count,), (count,)), "reduce": ((count,), (count,)),
            "broadcast": ((count,), None), "reduce_scatter": ((count,), (block,)),
            "allgather": ((block,), (P, block)), "gather": ((block,), (P, block)),
            "scatter": ((P, block), (block,)),
        }[collective]
        self.host_x = np.empty(shapes[0], dtype)
        self.host_out = np.empty(shapes[1], dtype) if shapes[1] else None
        self.fill()

    def fill(self):
        """This rank's inputs: rank_input(r) (broadcast: the root's; scatter: row q is
        rank q's block)."""
        r, x = self.comm.rank, self.host_x
        if self.collective == "scatter":
            for q in range(self.comm.world_size):
                fill_input(x[q], q)
        elif self.collective == "broadcast":
            fill_input(x, self.root) if r == self.root else x.fill(0)
        else:
            fill_input(x, r)
        self.x, self.out = self.host_x, self.host_out
        if self.device:         # device copies of the inputs (perf --device cuda)
            from shmcoll.cuda import array_converters
            to_device, self.to_host = array_converters()
            self.x = to_device(self.host_x)
            self.out = None if self.host_out is None else to_device(self.host_out)

    @property
    def nbytes(self):
        return self.count * self.dtype.itemsize

    def call(self, inplace):
        """The collective as a closure with positional arguments only: the timed loop
        adds a single Python call, as a user's own loop would."""
        c, x, op, algo, root, r = self.comm, self.x, self.op, self.algo, self.root, self.comm.rank
        out = self.out
        coll = self.collective
        if coll == "allreduce":
            return lambda: c.allreduce(x, x if inplace else out, op, algo)
        if coll == "reduce":
            return lambda: c.reduce(x, x if inplace else out, op, root, algo)
        if coll == "broadcast":
            return lambda: c.broadcast(x, root, algo)
        if coll == "reduce_scatter":
            m = self.count // c.world_size
            dst = x[r * m:(r + 1) * m] if inplace else out
            return lambda: c.reduce_scatter(x, dst, op, algo)
        if coll == "scatter":
            dst = x[r] if inplace and r == root else out
            return lambda: c.scatter(x, dst, root, algo)
        fn = c.allgather if coll == "allgather" else (lambda a, o, al: c.gather(a, o, root, al))
        if inplace:
            out[r] = x
            mine = out[r]
            return lambda: fn(mine, out, algo)
        return lambda: fn(x, out, algo)

    def _expected(self):
        """(block list, expect(start, n)) over this rank's flattened result, or None
        where this rank gets no result."""
        P, r, m = self.comm.world_size, self.comm.rank, self.count // self.comm.world_size
        coll = self.collective
        if coll in ("reduce", "gather") and r != self.root:
            return None
        if coll in ("allgather", "gather"):
            expect = lambda start, n: rank_input(start // m, n, self.dtype, start % m)
            blocks = [(q * m + s, min(CHECK_BLOCK, m - s)) for q in range(P) for s in range(0, m, CHECK_BLOCK)]
            return blocks, expect
        size = m if coll in ("reduce_scatter", "scatter") else self.count
        blocks = [(s, min(CHECK_BLOCK, size - s)) for s in range(0, size, CHECK_BLOCK)]
        if coll == "broadcast":
            return blocks, lambda start, n: rank_input(self.root, n, self.dtype, start)
        if coll == "scatter":
            return blocks, lambda start, n: rank_input(r, n, self.dtype, start)
        lo = r * m if coll == "reduce_scatter" else 0
        return blocks, lambda start, n: reduced_block(P, lo + start, n, self.dtype, self.op)

    def check(self, inplace):
        """Run once on fresh inputs and count wrong elements against numpy, block by
        block so that checking a 1 GiB message needs no more than a few MiB."""
        self.fill()
        got = self.call(inplace)()
        expected = self._expected()
        wrong = 0
        if expected is not None:
            got = (self.to_host(got) if self.device else got).reshape(-1)
            blocks, expect = expected
            wrong = sum(count_wrong(got[s:s + n], expect(s, n)) for s, n in blocks)
        self.fill()
        return wrong


def run_size(comm, collective, nbytes, dtype, op, algo, iters, warmup, check, inplace, root=0,
             device=False):
    case = Case(comm, collective, nbytes, dtype, op, algo, root, device)
    n = iters or auto_iters(case.nbytes)
    w = warmup if warmup >= 0 else max(2, n // 10)
    seconds = time_calls(comm, case.call(inplace), n, w)
    wrong = case.check(inplace) if check else 0
    wrong = int(comm.allreduce(np.array([wrong], np.int64))[0])
    algbw = case.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    chosen = comm.algorithm_for(collective, case.nbytes, algo, device=device)
    return Row(collective, comm.world_size, case.nbytes, case.count, str(case.dtype),
               op if collective in REDUCING else "none", chosen, inplace, seconds * 1e6,
               algbw, algbw * bus_factor(collective, comm.world_size), wrong)


TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16"}


def header(opts, algo):
    root = f"  root {opts.root}" if opts.collective in ROOTED else ""
    return "\n".join([
        f"# shmcoll perf {opts.collective}: nranks {opts.np}  minBytes {opts.minbytes}  "
        f"maxBytes {opts.maxbytes}  step factor {opts.factor:g}  iters {opts.iters or 'auto'}  "
        f"warmup {opts.warmup if opts.warmup >= 0 else 'auto'}  check {int(opts.check)}  "
        f"dtype {opts.dtype}  op {opts.op}  algo {algo or 'auto'}{root}"
        f"{'  device cuda' if getattr(opts, 'device', 'cpu') == 'cuda' else ''}",
        "#",
        f"# {'':>38}{'out-of-place':>27}{'in-place':>35}",
        f"# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'time':>9} {'algbw':>7} "
        f"{'busbw':>7} {'#wrong':>6}  {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  algorithm",
        f"# {'(B)':>10} {'(elements)':>12} {'':>9} {'':>6} {'(us)':>9} {'(GB/s)':>7} "
        f"{'(GB/s)':>7} {'':>6}  {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}",
    ])


ROOTED = ("broadcast", "reduce", "gather", "scatter")


def format_row(oop, inp):
    t = TYPE_NAMES.get(oop.dtype, oop.dtype)
    return (f"  {oop.size:>10} {oop.count:>12} {t:>9} {oop.op:>6} "
            f"{oop.time_us:>9.2f} {oop.algbw_GBs:>7.2f} {oop.busbw_GBs:>7.2f} {oop.wrong:>6}  "
            f"{inp.time_us:>9.2f} {inp.algbw_GBs:>7.2f} {inp.busbw_GBs:>7.2f} {inp.wrong:>6}  {oop.algo}")


def footer(rows):
    wrong = sum(r.wrong for r in rows)
    avg = sum(r.busbw_GBs for r in rows) / len(rows) if rows else 0.0
    return "\n".join([f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
                      f"# Avg bus bandwidth    : {avg:.4g}", "#"])


def comparison(rows_by_algo, auto_choice):
    """`--algo all`: out-of-place time per algorithm and size, the fastest marked *,
    and what auto picks for that size."""
    names = list(rows_by_algo)
    lines = ["# out-of-place time (us) per algorithm; * = fastest",
             f"# {'size':>10} " + " ".join(f"{n:>12}" for n in names) + "  auto picks"]
    for i, first in enumerate(rows_by_algo[names[0]][::2]):
        times = {n: rows_by_algo[n][2 * i].time_us for n in names}
        best = min(times, key=times.get)
        cells = " ".join(f"{times[n]:>11.2f}{'*' if n == best else ' '}" for n in names)
        lines.append(f"  {first.size:>10} {cells}  {auto_choice(first.size)}")
    return "\n".join(lines + ["#"])


def _progress(done, total, what):
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r# {done}/{total} sizes ({what})", end=end, file=sys.stderr, flush=True)


def sweep_worker(comm, opts):
    """Runs on every rank; rank 0 prints as it goes.  Returns rows (rank 0) or None."""
    from shmcoll.selector import algorithms_for
    device = getattr(opts, "device", "cpu") == "cuda"
    algos = algorithms_for(opts.collective) if opts.algo == "all" else [opts.algo]
    if device and opts.algo == "all":
        from shmcoll.cuda.path import VARIANTS
        algos = list(VARIANTS[opts.collective])
    sizes = size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    rows, by_algo, lead = [], {}, comm.rank == 0
    for algo in algos:
        if lead:
            print(header(opts, algo), flush=True)
        block = []
        for k, nbytes in enumerate(sizes):
            pair = [run_size(comm, opts.collective, nbytes, opts.dtype, opts.op, algo,
                             opts.iters, opts.warmup, opts.check, inplace, opts.root, device)
                    for inplace in (False, True)]
            block.extend(pair)
            if lead:
                print(format_row(*pair), flush=True)
                _progress(k + 1, len(sizes), algo or "auto")
        if lead:
            print(footer(block), flush=True)
        rows.extend(block)
        by_algo[algo or "auto"] = block
    if lead and len(algos) > 1:
        print(comparison(by_algo, lambda n: comm.algorithm_for(opts.collective, _sized(comm, opts, n),
                                                               device=device)),
              flush=True)
    return rows if lead else None


def _sized(comm, opts, nbytes):
    """The size a sweep point really has (blocked collectives round to world blocks)."""
    itemsize = np.dtype(opts.dtype).itemsize
    count = nbytes // itemsize
    if opts.collective in BLOCKED:
        count -= count % comm.world_size
    return count * itemsize


def run(opts):
    """Launch opts.np ranks, sweep, print; returns the process exit status."""
    from shmcoll.launch import launch
    rows = launch(sweep_worker, opts.np, args=(opts,), bind=getattr(opts, "bind", None))[0]
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    if opts.plot:
        from shmcoll.plot import plot_sweep
        plot_sweep(rows, opts.plot, opts.collective, opts.np)
        print(f"# plot written to {opts.plot}")
    return 1 if any(r.wrong for r in rows) else 0
