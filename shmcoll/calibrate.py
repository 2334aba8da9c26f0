"""`shmcoll calibrate`: measure the cost model's α, o, β, γ on this machine.

For one world size, every (collective, algorithm) pair runs at a few sizes from
8 B to a few MiB between live ranks (the timing core of `shmcoll perf`).  Each
measurement is a row of the schedule's cost terms (steps, messages, bytes moved,
bytes reduced) and its time; the parameters are the non-negative least-squares fit
of time against terms, weighted by 1/time so that an 8-byte call counts as much as
a 4 MiB one.  The fit is stored per (machine, world size) in the calibration file
(shmcoll.calibration) and used by every communicator of that size from then on.
"""
import itertools
import time

import numpy as np

from shmcoll.algorithms import REGISTRY
from shmcoll.algorithms.terms import CostModel
from shmcoll.calibration import PARAMETERS

SIZES = (8, 1 << 10, 16 << 10, 256 << 10, 4 << 20)
QUICK_SIZES = (8, 16 << 10, 1 << 20)
COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather",
               "scatter")


def measure(comm, sizes, budget_s):
    """Every rank: [(collective, algorithm, variant, nbytes, seconds)] for all pairs."""
    from shmcoll.perf import Case, time_calls
    rows = []
    for coll in COLLECTIVES:
        for name, alg in REGISTRY.items():
            if coll not in alg.COLLECTIVES:
                continue
            for nbytes in sizes:
                case = Case(comm, coll, nbytes, np.float32, "sum", name)
                call = case.call(False)
                t0 = time.perf_counter()
                call()
                once = comm.allreduce(np.array([time.perf_counter() - t0]), op="max")[0]
                iters = int(max(3, min(2000, budget_s / max(once, 1e-7))))
                seconds = time_calls(comm, call, iters, max(1, iters // 10))
                variant = comm._choose_variant(coll, case.nbytes, name)
                rows.append((coll, name, variant, case.nbytes, seconds))
    return rows


def terms_of(coll, name, variant, world, nbytes):
    for v, _, terms in REGISTRY[name].variants(coll, world, nbytes):
        if v == variant:
            return terms
    raise KeyError((coll, name, variant))


def fit(rows, world):
    """Non-negative least squares of time against (steps, messages, moved, reduced,
    one setup column per algorithm), relative error; returns (CostModel, rms error)."""
    names = sorted({r[1] for r in rows})
    a = np.array([terms_of(c, n, v, world, b).as_row() + tuple(float(n == m) for m in names)
                  for c, n, v, b, _ in rows], float)
    t = np.array([r[4] for r in rows], float)
    x, err = _nnls_relative(a, t)
    model = CostModel(**dict(zip(PARAMETERS, (float(v) for v in x[:4]))),
                      setup=tuple((m, float(v)) for m, v in zip(names, x[4:])))
    return model, err


def _nnls_relative(a, t):
    """argmin over x >= 0 of mean(((a·x - t)/t)^2), by exhaustive active sets (the
    problem has at most a dozen columns)."""
    w = a / t[:, None]
    ones = np.ones(len(t))
    scale = np.abs(w).max(axis=0)
    scale[scale == 0] = 1.0
    ncols = a.shape[1]
    best, best_err = np.zeros(ncols), np.inf
    for k in range(1, ncols + 1):
        for subset in itertools.combinations(range(ncols), k):
            cols = list(subset)
            sol, *_ = np.linalg.lstsq(w[:, cols] / scale[cols], ones, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(ncols)
            x[cols] = sol / scale[cols]
            err = float(np.sqrt(np.mean((w @ x - 1) ** 2)))
            if err < best_err:
                best, best_err = x, err
    return best, best_err


def calibrate_worker(comm, sizes, budget_s):
    rows = measure(comm, sizes, budget_s)
    return rows if comm.rank == 0 else None
