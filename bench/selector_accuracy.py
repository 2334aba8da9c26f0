"""How good are the cost model's choices on this machine?

For each world size, collective and message size, every algorithm and `auto` are timed
between live ranks in interleaved rounds (one call batch per algorithm per round, so a
slow stretch of the machine hits all of them; the order turns from round to round), and
the medians are compared:

  * auto / fastest: how much slower the automatic choice is than the best fixed one,
    once its trial (if any) settled: the calls a trial makes are counted apart;
  * the measured tree/ring crossover (the first size from which ring stays faster)
    against the modelled one (the model with only those two candidates).

    python bench/selector_accuracy.py -np 2 3 4 --rounds 5 --json accuracy.json

Uses the calibration in force (`shmcoll calibrate`), like every communicator.
"""
import argparse
import json
import sys
import time

import numpy as np

import shmcoll
from shmcoll.tuning import selector
from shmcoll.tools.harness import Case, size_sweep, time_calls
from shmcoll._core.sizes import parse_size

COLLECTIVES = ("allreduce", "broadcast", "allgather")


def _calls_for(seconds_once, budget):
    return int(max(2, min(1000, budget / max(seconds_once, 1e-7))))


def _round_order(algos, k):
    """Round k's order: rotated by k, reversed every other round.  Where ranks
    outnumber cores a batch's time depends on the one before it, so no algorithm may
    always follow the same one: in a fixed order, at P=4 on 2 cores, `auto` once
    measured 1.27x the very schedule it ran, and direct AllGather 0.8x rhd where
    `shmcoll bench-ab`'s alternating pairs put it at 1.1x."""
    k_ = k % len(algos)
    order = algos[k_:] + algos[:k_]
    return order[::-1] if k % 2 else order


def settle(comm, case, call):
    """Makes the calls auto's trial still runs at this size (tuning.trials: its first
    calls try the candidates in turn), so that the timed batches measure the schedule
    auto settled on; returns (calls, seconds) they took, the trial's cost."""
    n = comm.calls_until_settled(case.collective, case.nbytes)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return n, float(comm.allgather(np.array([time.perf_counter() - t0]))[:, 0].max())


def measure(comm, collectives, sizes, rounds, budget):
    """Every rank: {(collective, nbytes): {algo: [seconds per round]}}, what auto ran,
    and what its trials cost {(collective, nbytes): (calls, seconds)}."""
    results, chosen, trials = {}, {}, {}
    for coll in collectives:
        # cma where this job may use it: auto picks it, so it is one of the fixed choices
        algos = selector.algorithms_for(coll, cross_memory=comm.cross_memory is not None) + ["auto"]
        for nbytes in sizes:
            cases = {a: Case(comm, coll, nbytes, np.float32, "sum", None if a == "auto" else a)
                     for a in algos}
            calls = {a: c.call(False) for a, c in cases.items()}
            key = (coll, cases["auto"].nbytes)
            trials[key] = settle(comm, cases["auto"], calls["auto"])
            iters = {}
            for a, call in calls.items():     # one untimed call each; sizes the loops
                seconds = time_calls(comm, call, 1, 1)
                iters[a] = _calls_for(seconds, budget)
            times = {a: [] for a in algos}
            for k in range(rounds):
                for a in _round_order(algos, k):
                    times[a].append(time_calls(comm, calls[a], iters[a], 1))
            results[key] = times
            chosen[key] = comm.algorithm_for(coll, cases["auto"].nbytes)
    return results, chosen, trials


def worker(comm, collectives, sizes, rounds, budget, bind=False):
    if bind:
        from shmcoll.tools.harness import pin
        pin(comm.rank)
    results, chosen, trials = measure(comm, collectives, sizes, rounds, budget)
    return (results, chosen, trials, comm.model_source) if comm.rank == 0 else None


def modelled_crossover(coll, world, model):
    """Smallest n where ring is modelled faster than tree (None: never below 1 GiB)."""
    def ring_wins(n):
        t = selector.cost_table(coll, world, n, model)
        return t["ring"].seconds < t["tree"].seconds
    if not ring_wins(1 << 30):
        return None
    lo, hi = 0, 1 << 30
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ring_wins(mid) else (mid, hi)
    return hi


def measured_crossover(medians):
    """First size from which ring's median stays below tree's (None: never)."""
    sizes = sorted(medians)
    for i, n in enumerate(sizes):
        if all(medians[m]["ring"] < medians[m]["tree"] for m in sizes[i:]):
            return n
    return None


def report(world, results, chosen, model, trials):
    lines, summary = [], {}
    for coll in dict.fromkeys(c for c, _ in results):     # as measured, in order
        rows = sorted((n, t) for (c, n), t in results.items() if c == coll)
        if not rows:
            continue
        medians = {n: {a: float(np.median(v)) for a, v in t.items()} for n, t in rows}
        algos = [a for a in medians[rows[0][0]] if a != "auto"]
        lines.append(f"\n## P={world} {coll}: median time (us) over rounds; * fastest fixed")
        lines.append(f"{'size':>10} " + " ".join(f"{a:>10}" for a in algos)
                     + f" {'auto':>10}  {'auto picks':<20} auto/fastest")
        ratios = []
        for n, med in medians.items():
            best = min(algos, key=lambda a: med[a])
            ratio = med["auto"] / med[best]
            ratios.append(ratio)
            cells = " ".join(f"{med[a] * 1e6:>9.1f}{'*' if a == best else ' '}" for a in algos)
            lines.append(f"{n:>10} {cells} {med['auto'] * 1e6:>10.1f}  "
                         f"{chosen[(coll, n)]:<20} {ratio:5.2f}")
        within = sum(r <= 1.10 for r in ratios)
        lines.append(f"auto within 10% of the fastest at {within}/{len(ratios)} sizes; "
                     f"median auto/fastest {np.median(ratios):.2f}, worst {max(ratios):.2f}")
        tried = [trials[(coll, n)] for n, _ in rows if trials[(coll, n)][0]]
        trial_calls, trial_s = sum(k for k, _ in tried), sum(s for _, s in tried)
        lines.append(f"auto's trials (untimed above): {trial_calls} calls at {len(tried)} "
                     f"sizes, {trial_s * 1e3:.1f} ms in all")
        entry = {"within_10pct": within, "sizes": len(ratios),
                 "median_ratio": float(np.median(ratios)), "worst_ratio": float(max(ratios)),
                 "trial_calls": trial_calls, "trial_ms": trial_s * 1e3}
        if "tree" in algos and "ring" in algos:
            mod, mea = modelled_crossover(coll, world, model), measured_crossover(medians)
            lines.append(f"tree/ring crossover: modelled {mod} B, measured {mea} B")
            entry.update(modelled_crossover=mod, measured_crossover=mea)
        summary[coll] = entry
    return "\n".join(lines), summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", dest="worlds", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("-b", "--minbytes", type=parse_size, default=16)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--factor", type=float, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.02, help="seconds per timing")
    p.add_argument("--collectives", nargs="+", default=list(COLLECTIVES))
    p.add_argument("--json", default=None)
    p.add_argument("--bind", action="store_true", help="pin rank r to the r-th usable CPU")
    opts = p.parse_args(argv)
    sizes = size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    out = {}
    for world in opts.worlds:
        from shmcoll.tuning.calibration import model_for
        results, chosen, trials, source = shmcoll.launch(
            worker, world, args=(opts.collectives, sizes, opts.rounds, opts.budget, opts.bind))[0]
        model, _ = model_for(world)         # (after the ranks: they may have calibrated)
        text, summary = report(world, results, chosen, model, trials)
        print(f"# P={world}, cost model: {source}{text}", flush=True)
        out[world] = {"summary": summary, "model_source": source,
                      "medians_us": {f"{c}:{n}": {a: float(np.median(v)) * 1e6 for a, v in t.items()}
                                     for (c, n), t in results.items()},
                      "auto_picks": {f"{c}:{n}": a for (c, n), a in chosen.items()}}
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
