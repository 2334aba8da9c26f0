"""Single copy against the regular path: the same collective on ordinary arrays and on
symmetric ones (Communicator.empty), timed in interleaved rounds in one job.

For each size the variants run one batch each per round (so a slow stretch of the
machine hits all of them); the table gives the median over rounds of the max over
ranks of the mean per call, and ratios to the regular path:

    python bench/symmetric.py -np 2 --collective allreduce -b 4K -e 64M -f 8 --rounds 5

Variants (allreduce): `regular` (ordinary x and out, auto), `regular in place`,
`symmetric` (x and out symmetric, auto), `symmetric in place` (out=x, auto), and the
single-copy schedules forced: `one-shot` (out ordinary), `two-shot` (out symmetric).
Other collectives: `regular` and `symmetric` (auto), and `single copy` forced.  Where
the ranks may read each other's memory, `cma` too: single copy of the ordinary arrays
with cross-memory attach, forced (`--fresh` shows what its price depends on:
tuning.algorithms.cma).

--fresh rewrites every rank's x before each call (outside the timed span), as a
training loop does with its gradients: peers then read lines another core has just
modified instead of lines already in their own cache from the previous call.
"""
import argparse
import json
import time

import numpy as np

import shmcoll
from shmcoll._core.sizes import format_size, parse_size
from shmcoll.tools.harness import Case, size_sweep, time_calls

# name: (symmetric buffers, in place, algo)
ALLREDUCE = {"regular": (False, False, None), "regular in place": (False, True, None),
             "symmetric": (True, False, None), "symmetric in place": (True, True, None),
             "one-shot": ("x only", False, "symmetric"), "two-shot": (True, True, "symmetric")}
OTHERS = {"regular": (False, False, None), "symmetric": (True, False, None),
          "single copy": (True, False, "symmetric")}


def _case(comm, coll, nbytes, symmetric, algo):
    case = Case(comm, coll, nbytes, np.float32, "sum", algo, symmetric=symmetric is True)
    if symmetric == "x only":       # one-shot: x symmetric, out an ordinary array
        x = comm.empty(case.host_x.shape, case.dtype)
        x[...] = case.host_x
        case.host_x = case.x = x
    return case


def _fresh_call(comm, case, call):
    """call() after every rank rewrote its x (one store per 64-byte line) and met the
    others at a barrier, timed alone."""
    x = case.x.reshape(-1).view(np.uint8)
    lines = x[::64]
    spent = [0.0]

    def timed():
        np.add(lines, 1, out=lines)
        comm.barrier()      # every rank has rewritten its x: the wait is not the call's
        t0 = time.perf_counter()
        call()
        spent[0] += time.perf_counter() - t0
    return timed, spent


def time_fresh(comm, timed, spent, iters):
    """Like time_calls, counting only the calls' own time."""
    timed()
    comm.barrier()
    spent[0] = 0.0
    for _ in range(iters):
        timed()
    return float(comm.allgather(np.array([spent[0] / iters]))[:, 0].max())


def _out_case(coll, sym, inplace):
    """What the decider of a symmetric x is asked for (Communicator.algorithm_for)."""
    if not sym:
        return None
    return "in place" if inplace and coll == "allreduce" else \
        "plain" if sym == "x only" else "symmetric"


def measure(comm, coll, sizes, rounds, fresh=False):
    variants = dict(ALLREDUCE if coll == "allreduce" else OTHERS)
    if comm.cross_memory is not None:
        variants["cma"] = (False, False, "cma")
    rows = []
    for nbytes in sizes:
        cases = {name: (_case(comm, coll, nbytes, sym, algo), inplace)
                 for name, (sym, inplace, algo) in variants.items()}
        calls = {name: case.call(inplace) for name, (case, inplace) in cases.items()}
        iters = max(5, min(2000, int(3e7 // max(nbytes, 1))))
        times = {name: [] for name in variants}
        fresh_calls = {name: _fresh_call(comm, cases[name][0], call)
                       for name, call in calls.items()} if fresh else None
        for name, call in calls.items():    # auto's trial settles on calls made as timed
            case, warm = cases[name][0], fresh_calls[name][0] if fresh else call
            sym, inplace, algo = variants[name]
            for _ in range(3 + comm.calls_until_settled(coll, case.nbytes, algo,
                                                        symmetric=_out_case(coll, sym, inplace))):
                warm()
        for _ in range(rounds):
            for name, call in calls.items():
                if fresh:
                    times[name].append(time_fresh(comm, *fresh_calls[name], iters))
                else:
                    times[name].append(time_calls(comm, call, iters, 1))
        wrong = {name: case.check(inplace) for name, (case, inplace) in cases.items()}
        picks = {name: comm.algorithm_for(coll, cases[name][0].nbytes, algo,
                                          symmetric=_out_case(coll, sym, inplace))
                 for name, (sym, inplace, algo) in variants.items()}
        rows.append({"bytes": cases["regular"][0].nbytes,
                     "us": {n: float(np.median(t)) * 1e6 for n, t in times.items()},
                     "wrong": wrong, "runs": picks})
    return rows


def worker(comm, opts):
    sizes = [parse_size(s) for s in opts.sizes.split(",")] if opts.sizes else \
        size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    return measure(comm, opts.collective, sizes, opts.rounds, opts.fresh)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--collective", default="allreduce")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--factor", type=float, default=8)
    p.add_argument("--sizes", default=None, help="comma-separated sizes (instead of -b/-e/-f)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fresh", action="store_true", help="rewrite x before every call")
    p.add_argument("--json", default=None)
    opts = p.parse_args()
    rows = shmcoll.launch(worker, opts.np, args=(opts,))[0]
    names = list(rows[0]["us"])
    print(f"# {opts.collective}, P={opts.np}, float32 sum, µs (median of {opts.rounds} "
          f"interleaved rounds, max over ranks of the mean per call"
          f"{'; x rewritten before every call' if opts.fresh else ''})")
    cma = "cma" in names
    print("| bytes | " + " | ".join(names) + " | best symmetric / best regular |" +
          (" cma / best regular |" if cma else "") + " regular auto runs | symmetric auto runs |")
    print("|---" * (len(names) + 4 + cma) + "|")
    for row in rows:
        us = row["us"]
        regular = min(v for n, v in us.items() if n.startswith("regular"))
        single = min(v for n, v in us.items() if not n.startswith("regular") and n != "cma")
        bad = sum(row["wrong"].values())
        print(f"| {format_size(row['bytes'])} | " + " | ".join(f"{us[n]:.2f}" for n in names) +
              f" | {single / regular:.2f} |" + (f" {us['cma'] / regular:.2f} |" if cma else "") +
              f" {row['runs']['regular']} | {row['runs']['symmetric']}"
              f"{'' if not bad else f' ({bad} WRONG)'} |")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
