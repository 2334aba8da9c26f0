"""How much of an allreduce a nonblocking call hides behind computation.

The loop of data-parallel training with gradient buckets: for each bucket k, issue
its allreduce with async_op=True, then compute (a float32 matmul, one BLAS thread per
rank, sized so that one step takes about as long as one allreduce of the bucket);
wait for every work at the end.  The same loop with blocking allreduces is the
baseline.  Per step, in medians over interleaved repeats:

    comm, compute  each step alone (comm cycling over the buckets, as the loops do)
    ideal    = max(compute, comm)      everything hidden
    serial   = compute + comm          nothing hidden, if the two did not disturb each other
    blocking = the loop with blocking calls, measured (what a user gets without async_op)
    hidden   = (blocking - overlapped) / (blocking - ideal): the share of what could be
               hidden that was

P=1 is the one-process baseline: its "communication" is the progress thread copying
the bucket, so it shows what a second thread can overlap on this machine when a core
is free for it.  With P ranks on fewer than 2P cores, the progress threads compete with
the ranks' own computation for the cores, and only the time a collective spends
waiting for peers can be hidden.

    python bench/overlap.py -np 1 2 --sizes 256K 1M 4M 16M --repeats 5 --json overlap.json
"""
import argparse
import json
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")    # before numpy: one BLAS thread per rank

import numpy as np  # noqa: E402

import shmcoll  # noqa: E402
from shmcoll._core.sizes import parse_size  # noqa: E402


def _median(xs):
    return float(np.median(xs))


def _matmul_of(n):
    a = np.random.default_rng(n).standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    return lambda: np.matmul(a, a, out=out)


def _time(fn, calls=5, warm=1):
    for _ in range(warm):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _compute_like(seconds):
    """A matmul step of about `seconds` (time ~ n cubed; damped, medians of 3)."""
    n = 64
    for _ in range(8):
        t = float(np.median([_time(_matmul_of(n), 3) for _ in range(3)]))
        n = int(min(4096, max(8, n * (seconds / t) ** (1 / 6))))
    return n


def _cycle(comm, buckets, outs):
    """One blocking allreduce per call, of the next bucket each time."""
    state = {"k": 0}

    def call():
        k = state["k"] = (state["k"] + 1) % len(buckets)
        comm.allreduce(buckets[k], outs[k])
    return call


def _loops(comm, buckets, outs, compute):
    """(blocking, overlapped) seconds per step of one pass over the buckets."""
    comm.barrier()
    t0 = time.perf_counter()
    for x, out in zip(buckets, outs):
        comm.allreduce(x, out)
        compute()
    blocking = time.perf_counter() - t0
    comm.barrier()
    t0 = time.perf_counter()
    works = []
    for x, out in zip(buckets, outs):
        works.append(comm.allreduce(x, out, async_op=True))
        compute()
    for w in works:
        w.wait()
    overlapped = time.perf_counter() - t0
    return blocking / len(buckets), overlapped / len(buckets)


def measure(comm, sizes, steps, repeats):
    rows = []
    P = comm.world_size
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        buckets = [np.full(count, comm.rank + 1, np.float32) for _ in range(steps)]
        outs = [np.empty_like(b) for b in buckets]
        cycle = _cycle(comm, buckets, outs)
        comm_s = _time(cycle, 2 * steps, warm=2 * steps)   # every out touched first
        n = int(comm.broadcast(np.array([_compute_like(comm_s)]), root=0)[0])
        compute = _matmul_of(n)
        comm_t, compute_t, blocking, overlapped = [], [], [], []
        for _ in range(repeats):
            comm.barrier()
            comm_t.append(_time(cycle, steps))
            compute_t.append(_time(compute, steps))
            b, o = _loops(comm, buckets, outs, compute)
            blocking.append(b)
            overlapped.append(o)
        wrong = sum(int(np.count_nonzero(o != P * (P + 1) // 2)) for o in outs)
        c, p = _median(comm_t), _median(compute_t)
        rows.append({"world": P, "bytes": count * 4, "matmul_n": n, "comm_us": c * 1e6,
                     "compute_us": p * 1e6, "blocking_us": _median(blocking) * 1e6,
                     "overlapped_us": _median(overlapped) * 1e6, "wrong": wrong})
    return rows


def _report(row):
    ideal = max(row["comm_us"], row["compute_us"])
    serial = row["comm_us"] + row["compute_us"]
    o, b = row["overlapped_us"], row["blocking_us"]
    row.update(ideal_us=ideal, serial_us=serial, over_ideal=o / ideal, over_blocking=o / b,
               hidden=(b - o) / (b - ideal) if b > ideal else 0.0)
    return (f"{row['world']:>3} {row['bytes']:>10} {row['comm_us']:>9.0f} "
            f"{row['compute_us']:>9.0f} {row['blocking_us']:>9.0f} {o:>10.0f} "
            f"{ideal:>8.0f} {serial:>8.0f} {row['over_ideal']:>7.2f} {row['over_blocking']:>7.2f} "
            f"{100 * row['hidden']:>6.0f}% {row['wrong']:>5}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-np", dest="worlds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", nargs="+", default=["256K", "1M", "4M", "16M"])
    ap.add_argument("--steps", type=int, default=8, help="buckets per pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the rows here")
    opts = ap.parse_args(argv)
    sizes = [parse_size(s) for s in opts.sizes]
    print(f"{'P':>3} {'bytes':>10} {'comm us':>9} {'comp us':>9} {'blocking':>9} "
          f"{'overlapped':>10} {'ideal':>8} {'serial':>8} {'/ideal':>7} {'/block':>7} "
          f"{'hidden':>7} {'wrong':>5}")
    rows = []
    for world in opts.worlds:
        for row in shmcoll.launch(measure, world, args=(sizes, opts.steps, opts.repeats))[0]:
            print(_report(row), flush=True)
            rows.append(row)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
