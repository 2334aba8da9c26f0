"""`shmcoll calibrate`: measure the cost model's α, o, β, γ on this machine.

For one world size, every (collective, algorithm) pair runs at a few sizes from
64 B to 64 MiB between live ranks (the timing core of `shmcoll perf`, median of
three timings; with --runs N, the median of N such runs a few seconds apart).  Each
measurement is a row of the schedule's cost terms (steps, messages, bytes copied,
bytes reduced, one setup column per algorithm) and its time.  Each collective gets
its own fit — the non-negative least-squares fit of time against terms, weighted by
1/time so that a 64-byte call counts as much as a 64 MiB one — because what decides
between its algorithms is how they compare on its own traffic pattern.  The fits are
stored per (machine, world size) in the calibration file (shmcoll.tuning.calibration)
and used by every communicator of that size.
"""
import argparse
import time

import numpy as np

from shmcoll.collectives import NAMES as COLLECTIVES
from shmcoll.tools.harness import Case, time_calls
from shmcoll.tuning import calibration, selector
from shmcoll.tuning.algorithms import REGISTRY
from shmcoll.tuning.algorithms.terms import CostModel, Models

HELP = "measure the cost model's parameters on this machine"

# >= 64 B: no empty blocks; up to 64 MiB, where footprints outgrow the caches and
# schedules that tie at 16 MiB part (measured: 1.15x at 4 ranks on 2 cores)
SIZES = (64, 1 << 10, 16 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)
QUICK_SIZES = (64, 16 << 10, 1 << 20)
REPEATS = 3       # timings per point; the median is kept (a 2-core VM is bimodal)
RUN_GAP_S = 5.0   # between runs of --runs


def _pairs(device):
    """(collective, algorithm) pairs to measure: all, or those of the GPU path."""
    if device:
        from shmcoll.cuda.path import VARIANTS
        return [(c, a) for c in COLLECTIVES for a in VARIANTS.get(c, ())]
    return [(c, name) for c in COLLECTIVES for name, alg in REGISTRY.items()
            if c in alg.COLLECTIVES]


def measure(comm, sizes, budget_s, device=False):
    """Every rank: [(collective, algorithm, variant, nbytes, seconds)] for all pairs
    (device=True: on device arrays, through the GPU path)."""
    decider = comm._decider(device)
    rows = []
    for coll, name in _pairs(device):
        for nbytes in sizes:
            case = Case(comm, coll, nbytes, np.float32, "sum", name, device=device)
            call = case.call(False)
            t0 = time.perf_counter()
            call()
            comm.synchronize()
            once = comm.allreduce(np.array([time.perf_counter() - t0]), op="max")[0]
            iters = int(max(3, min(2000, budget_s / REPEATS / max(once, 1e-7))))
            seconds = float(np.median([time_calls(comm, call, iters, max(1, iters // 10))
                                       for _ in range(REPEATS)]))
            variant = decider.decide(coll, case.nbytes, name).candidate.variant
            rows.append((coll, name, variant, case.nbytes, seconds))
    return rows


def terms_of(coll, name, variant, world, nbytes):
    for v, _, terms in REGISTRY[name].variants(coll, world, nbytes):
        if v == variant:
            return terms
    raise KeyError((coll, name, variant))


def fit(rows, world):
    """Non-negative least squares of time against (steps, messages, reduced) shared by
    all algorithms and (bytes moved, 1) per algorithm — its own β and setup — on
    relative error; returns (CostModel, rms relative error)."""
    rows = [r for r in rows if r[3] > 0 and r[4] > 0]
    names = sorted({r[1] for r in rows})
    a = []
    for coll, name, variant, nbytes, _ in rows:
        steps, messages, moved, reduced = terms_of(coll, name, variant, world, nbytes).as_row()
        per_alg = []
        for m in names:
            per_alg += [moved if m == name else 0.0, 1.0 if m == name else 0.0]
        a.append([steps, messages, reduced] + per_alg)
    t = np.array([r[4] for r in rows], float)
    x, err = _nnls_relative(np.array(a, float), t)
    betas = {m: float(x[3 + 2 * i]) for i, m in enumerate(names)}
    shared = float(np.median(list(betas.values())))
    model = CostModel(alpha=float(x[0]), overhead=float(x[1]), beta=shared, gamma=float(x[2]),
                      setup=tuple((m, float(x[4 + 2 * i])) for i, m in enumerate(names)),
                      bandwidth=tuple(sorted(betas.items())))
    return model, err


def _nnls_relative(a, t):
    """argmin over x >= 0 of mean(((a·x - t)/t)^2): Lawson-Hanson active sets."""
    w = a / t[:, None]
    scale = np.abs(w).max(axis=0)
    scale[scale == 0] = 1.0
    x = _nnls(w / scale, np.ones(len(t))) / scale
    return x, float(np.sqrt(np.mean((w @ x - 1) ** 2)))


def _nnls(a, b, tol=1e-12):
    """min |a·x - b| over x >= 0 (Lawson & Hanson 1974)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    for _ in range(3 * n):
        grad = a.T @ (b - a @ x)
        if passive.all() or grad[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
    return x


def pooled(runs_of_rows):
    """One row per point from several runs of measure(): the median of its times.  A
    run's timings of a point lie within seconds of each other; where the machine
    switches between modes for longer than that (4 ranks on 2 cores: a ring AllReduce
    of 1 MiB took 104 to 362 us from one run to the next, rhd 123 to 160) only
    separate runs see both."""
    times = {}
    for rows in runs_of_rows:
        for coll, name, variant, nbytes, seconds in rows:
            times.setdefault((coll, name, variant, nbytes), []).append(seconds)
    return [key + (float(np.median(t)),) for key, t in times.items()]


def fit_all(rows, world):
    """{collective: (CostModel, rms relative error)} from measure()'s rows."""
    return {coll: fit([r for r in rows if r[0] == coll], world)
            for coll in COLLECTIVES if any(r[0] == coll for r in rows)}


def calibrate_worker(comm, sizes, budget_s, device=False):
    """Rank 0: (rows, the GPU's name for the calibration key, or None)."""
    rows = measure(comm, sizes, budget_s, device)
    gpu = comm._device().backend.identity().decode() if device else None
    return (rows, gpu) if comm.rank == 0 else None


def main(argv):
    from shmcoll.launch import launch
    p = argparse.ArgumentParser(prog="shmcoll calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--nprocs", dest="worlds", type=int, nargs="+", default=[2, 4],
                   help="world sizes to calibrate (default: 2 4)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timings")
    p.add_argument("--dry-run", action="store_true", help="measure and print, do not save")
    p.add_argument("--runs", type=int, default=1,
                   help="measure N times, a few seconds apart, and fit the median of each "
                        "point (for machines whose speed switches between modes)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: calibrate the GPU path (device arrays; stored per GPU)")
    opts = p.parse_args(argv)
    if any(w < 2 for w in opts.worlds):
        p.error("world sizes must be >= 2 (one rank has nothing to calibrate)")
    device = opts.device == "cuda"
    variants = None
    if device:
        from shmcoll.cuda import array_converters
        from shmcoll.cuda.path import VARIANTS as variants
        from shmcoll.errors import DeviceError
        try:
            array_converters()
        except DeviceError as e:
            p.error(f"--device cuda: {e}")
    sizes = QUICK_SIZES if opts.quick else SIZES
    budget = 0.02 if opts.quick else 0.1
    if opts.runs < 1:
        p.error("--runs must be >= 1")
    for world in opts.worlds:
        print(f"# calibrating {world} ranks ({len(sizes)} sizes per algorithm"
              f"{f', {opts.runs} runs' if opts.runs > 1 else ''})...", flush=True)
        runs = []
        for i in range(opts.runs):
            if i:
                time.sleep(RUN_GAP_S)
            rows, gpu = launch(calibrate_worker, world, args=(sizes, budget, device))[0]
            runs.append(rows)
        rows = pooled(runs)
        fits = fit_all(rows, world)
        print(f"  {'collective':<15} {'alpha us':>8} {'o us':>6} {'beta GB/s':>9} "
              f"{'gamma GB/s':>10} {'rms err':>7}  setup us")
        for coll, (m, err) in fits.items():
            setup = " ".join(f"{a}={v * 1e6:.2f}" for a, v in m.setup if v)
            print(f"  {coll:<15} {m.alpha * 1e6:>8.3f} {m.overhead * 1e6:>6.3f} "
                  f"{format_gbs(m.beta):>9} {format_gbs(m.gamma):>10} {err:>7.1%}  {setup}")
        base = calibration.DEVICE_DEFAULT if device else calibration.default_model(world)
        models = Models(base.default, tuple(sorted((c, m) for c, (m, _) in fits.items())))
        print(f"  decisions: {selector.describe(world, models, variants=variants)}")
        if not opts.dry_run:
            path = calibration.save(world, fits, {"measurements": len(rows), "runs": opts.runs},
                                    device=gpu)
            print(f"  saved to {path}")
    return 0


def format_gbs(seconds_per_byte):
    """Bytes per second of a per-byte cost, in GB/s, for tables."""
    return f"{1 / seconds_per_byte / 1e9:.2f}" if seconds_per_byte else "inf"
