"""`shmcoll perf`: an nccl-tests style throughput tester, and the timing core that the
benchmark suite shares.

Conventions (nccl-tests): size is the bytes of the full vector (allreduce: x;
reduce_scatter: x on each rank; allgather: the gathered output); time is the max
over ranks of the mean per-call time; algbw = size / time; busbw = algbw x 2(P-1)/P
for allreduce and x (P-1)/P for reduce_scatter and allgather.
"""
import json
import time
from dataclasses import asdict, dataclass

import numpy as np

REDUCING = ("allreduce", "reduce_scatter")


def bus_factor(collective, world):
    if world == 1:
        return 1.0
    if collective == "allreduce":
        return 2.0 * (world - 1) / world
    return (world - 1) / world


def parse_size(text):
    """'8', '4K', '1.5M', '2G' -> bytes."""
    s = str(text).strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)
    except ValueError:
        raise ValueError(f"invalid size {text!r} (use e.g. 8, 4K, 64M, 1G)") from None


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

    def __init__(self, comm, collective, nbytes, dtype, op, algo):
        self.comm, self.collective, self.op, self.algo = comm, collective, op, algo
        P, itemsize = comm.world_size, np.dtype(dtype).itemsize
        count = nbytes // itemsize
        if collective != "allreduce":
            count -= count % P
        self.count, self.dtype = count, np.dtype(dtype)
        per_rank = count // P if collective == "allgather" else count
        self.x = np.empty(per_rank, dtype)
        fill_input(self.x, comm.rank)
        out_shape = {"allreduce": (count,), "reduce_scatter": (count // P,),
                     "allgather": (P, per_rank)}[collective]
        self.out = np.empty(out_shape, dtype)

    @property
    def nbytes(self):
        return self.count * self.dtype.itemsize

    def call(self, inplace):
        """The collective as a closure with positional arguments only: the timed loop
        adds a single Python call, as a user's own loop would."""
        c, x, op, algo = self.comm, self.x, self.op, self.algo
        if self.collective == "allreduce":
            out = x if inplace else self.out
            return lambda: c.allreduce(x, out, op, algo)
        if self.collective == "reduce_scatter":
            m = self.count // c.world_size
            out = x[c.rank * m:(c.rank + 1) * m] if inplace else self.out
            return lambda: c.reduce_scatter(x, out, op, algo)
        out = self.out
        if inplace:
            out[c.rank] = x
            mine = out[c.rank]
            return lambda: c.allgather(mine, out, algo)
        return lambda: c.allgather(x, out, algo)

    def check(self, inplace):
        """Run once on fresh inputs and count wrong elements against numpy, block by
        block so that checking a 1 GiB message needs no more than a few MiB."""
        P, r = self.comm.world_size, self.comm.rank
        fill_input(self.x, r)
        got = self.call(inplace)().reshape(-1)
        if self.collective == "allgather":
            m = self.count // P
            expect = lambda start, n: rank_input(start // m, n, self.dtype, start % m)
            blocks = [(q * m + s, min(CHECK_BLOCK, m - s)) for q in range(P) for s in range(0, m, CHECK_BLOCK)]
        else:
            lo = r * (self.count // P) if self.collective == "reduce_scatter" else 0
            expect = lambda start, n: reduced_block(P, lo + start, n, self.dtype, self.op)
            blocks = [(s, min(CHECK_BLOCK, got.size - s)) for s in range(0, got.size, CHECK_BLOCK)]
        wrong = sum(count_wrong(got[s:s + n], expect(s, n)) for s, n in blocks)
        fill_input(self.x, r)
        return wrong


def run_size(comm, collective, nbytes, dtype, op, algo, iters, warmup, check, inplace):
    from shmcoll import selector
    case = Case(comm, collective, nbytes, dtype, op, algo)
    n = iters or auto_iters(case.nbytes)
    w = warmup if warmup >= 0 else max(2, n // 10)
    seconds = time_calls(comm, case.call(inplace), n, w)
    wrong = case.check(inplace) if check else 0
    wrong = int(comm.allreduce(np.array([wrong], np.int64))[0])
    algbw = case.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    chosen = selector.choose(collective, comm.world_size, case.nbytes, algo)
    return Row(collective, comm.world_size, case.nbytes, case.count, str(case.dtype),
               op if collective in REDUCING else "none", chosen, inplace, seconds * 1e6,
               algbw, algbw * bus_factor(collective, comm.world_size), wrong)


TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16"}


def header(opts):
    return "\n".join([
        f"# shmcoll perf {opts.collective}: nranks {opts.np}  minBytes {opts.minbytes}  "
        f"maxBytes {opts.maxbytes}  step factor {opts.factor:g}  iters {opts.iters or 'auto'}  "
        f"warmup {opts.warmup if opts.warmup >= 0 else 'auto'}  check {int(opts.check)}  "
        f"dtype {opts.dtype}  op {opts.op}  algo {opts.algo or 'auto'}",
        "#",
        f"# {'':>38}{'out-of-place':>27}{'in-place':>35}",
        f"# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'time':>9} {'algbw':>7} "
        f"{'busbw':>7} {'#wrong':>6}  {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}",
        f"# {'(B)':>10} {'(elements)':>12} {'':>9} {'':>6} {'(us)':>9} {'(GB/s)':>7} "
        f"{'(GB/s)':>7} {'':>6}  {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}",
    ])


def format_row(oop, inp):
    t = TYPE_NAMES.get(oop.dtype, oop.dtype)
    return (f"  {oop.size:>10} {oop.count:>12} {t:>9} {oop.op:>6} "
            f"{oop.time_us:>9.2f} {oop.algbw_GBs:>7.2f} {oop.busbw_GBs:>7.2f} {oop.wrong:>6}  "
            f"{inp.time_us:>9.2f} {inp.algbw_GBs:>7.2f} {inp.busbw_GBs:>7.2f} {inp.wrong:>6}")


def footer(rows):
    wrong = sum(r.wrong for r in rows)
    avg = sum(r.busbw_GBs for r in rows) / len(rows) if rows else 0.0
    return "\n".join([f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
                      f"# Avg bus bandwidth    : {avg:.4g}", "#"])


def sweep_worker(comm, opts):
    """Runs on every rank; rank 0 prints as it goes.  Returns rows (rank 0) or None."""
    rows = []
    if comm.rank == 0:
        print(header(opts), flush=True)
    for nbytes in size_sweep(opts.minbytes, opts.maxbytes, opts.factor):
        pair = [run_size(comm, opts.collective, nbytes, opts.dtype, opts.op, opts.algo,
                         opts.iters, opts.warmup, opts.check, inplace) for inplace in (False, True)]
        rows.extend(pair)
        if comm.rank == 0:
            print(format_row(*pair), flush=True)
    if comm.rank == 0:
        print(footer(rows), flush=True)
        return rows
    return None


def run(opts):
    """Launch opts.np ranks, sweep, print; returns the process exit status."""
    from shmcoll.launch import launch
    rows = launch(sweep_worker, opts.np, args=(opts,))[0]
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 1 if any(r.wrong for r in rows) else 0
