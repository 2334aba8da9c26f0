"""`shmcoll bench-ab`: compare two builds or settings side by side, interleaved.

On a shared machine the speed of cross-core transfers drifts by tens of percent over
seconds to minutes, so two benchmark runs made minutes apart differ even when the
code does not.  Here the two sides run at the same time: each side is a live job of
P ranks (its own Python, so an installed older version can be one side, and its own
SHMCOLL_* settings), and for every benchmark the driver asks side A, then side B,
then B, then A ... for a short timing.  Each pair is taken within a fraction of a
second, so drift cancels in the ratio B/A; the median over pairs is the change, and a
benchmark counts as slower only when three quarters of its pairs say so (the lower
quartile of B/A exceeds 1 + threshold): one unlucky pair cannot fail it.

    shmcoll bench-ab --b-env SHMCOLL_ALGO=allreduce:naive         # a setting
    shmcoll bench-ab --a-python /old/venv/bin/python               # an older build

A side is rank 0 (a server process reading JSON requests on stdin) plus P-1 mirror
processes joined by name, as in the pytest-benchmark suite.
"""
import json
import os
import secrets
import signal
import subprocess
import sys

import numpy as np

from shmcoll.tools.harness import (build, exchange_command, median_call_seconds, pin,
                                   start_mirrors)

SIZES = (8, 4 << 10, 256 << 10, 16 << 20)
HELP = "compare two builds or settings, interleaved in one session"

# A side's server, started in that side's Python: this module where the side has it,
# else where builds before the tools/ folder kept it (so an installed older version
# can still be side A).
_SERVE = ("import importlib.util, runpy, sys\n"
          "name = 'shmcoll.tools.bench_ab'\n"
          "if importlib.util.find_spec('shmcoll.tools') is None: name = 'shmcoll.abtest'\n"
          "sys.argv[0] = name\n"
          "runpy.run_module(name, run_name='__main__', alter_sys=True)\n")


def serve(world):
    """Rank 0 of a side: one JSON request per stdin line, one JSON answer per line."""
    import shmcoll
    job = "ab-" + secrets.token_hex(8)
    mirrors = start_mirrors(world, job)
    pin(0)
    try:
        comm = shmcoll.init(rank=0, world_size=world, job=job)
    except BaseException:
        # The mirrors would wait the whole join timeout for this rank, holding the
        # driver's pipe (their stdout) open: the driver would hear of it only then.
        # Interrupted (not killed), the one that created the job's segment unlinks it.
        for m in mirrors:
            m.send_signal(signal.SIGINT)
        for m in mirrors:
            m.wait(60)
        raise
    try:
        for line in sys.stdin:
            req = json.loads(line)
            if req["collective"] == "stop":
                break
            exchange_command(comm, req)
            case, call = build(comm, req)
            call()      # the mirrors repeat `calls`: one untimed, the rest timed
            print(json.dumps({"median": median_call_seconds(call, req["calls"] - 1),
                              "algorithm": comm.algorithm_for(req["collective"], case.nbytes,
                                                              req.get("algo"))}), flush=True)
    finally:
        exchange_command(comm, {"collective": "stop"})
        comm.close()
        for m in mirrors:
            m.wait(60)


# -- the driver -------------------------------------------------------------------------

class SideExited(RuntimeError):
    """A side's server ended before answering (it failed to start or crashed)."""


class Side:
    """One side of the comparison: a server process and its mirrors."""

    def __init__(self, name, world, python, env):
        self.name = name
        self.proc = subprocess.Popen([python, "-c", _SERVE, "--serve", str(world)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def time(self, request):
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise SideExited(f"side {self.name} exited (status {self.proc.wait()}); "
                             f"its error is above")
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.write(json.dumps({"collective": "stop"}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(60)


def calls_for(nbytes):
    """About 20-50 ms of traffic per timing, at least 3 calls."""
    return max(3, min(500, int(4e7 // max(nbytes, 1))))


def slower(ratios, threshold_pct):
    """Three quarters of the pairs show B slower than A by more than the threshold."""
    return float(np.percentile(ratios, 25)) > 1 + threshold_pct / 100


def compare(cases, sides, pairs):
    """{case: (median ratio B/A, [ratios], algorithm A, algorithm B)}, interleaved
    A B B A A B ... so that neither side is always measured first."""
    out = {}
    for case in cases:
        req = dict(case, calls=calls_for(case["nbytes"]))
        ratios, algos = [], [None, None]
        for i in range(pairs):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            got = {}
            for s in order:
                answer = sides[s].time(req)
                got[s] = answer["median"]
                algos[s] = answer["algorithm"]
            ratios.append(got[1] / got[0])
        out[_name(case)] = (float(np.median(ratios)), ratios, algos[0], algos[1])
    return out


def _name(case):
    return f"{case['collective']}-{case['algo'] or 'auto'}-{case['nbytes']}B-{case['world']}"


def suite(worlds, sizes, collectives=None):
    from shmcoll.collectives import NAMES as ALL_COLLECTIVES
    from shmcoll.tuning.selector import algorithms_for
    return [{"world": w, "collective": c, "algo": a, "nbytes": n}
            for w in worlds for c in (collectives or ALL_COLLECTIVES)
            for a in algorithms_for(c) + [None] for n in sizes]


def _env(overrides):
    env = dict(os.environ)
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected NAME=VALUE, got {item!r}")
        env[key] = value
    return env


def main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="shmcoll bench-ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a-python", default=sys.executable, help="Python of side A (baseline)")
    p.add_argument("--b-python", default=sys.executable, help="Python of side B (candidate)")
    p.add_argument("--a-env", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--b-env", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("-np", dest="worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes", nargs="+", default=[str(s) for s in SIZES])
    p.add_argument("--collectives", nargs="+", default=None)
    p.add_argument("--pairs", type=int, default=7, help="interleaved A/B pairs per benchmark")
    p.add_argument("--threshold", type=float, default=15.0, help="percent (default 15)")
    p.add_argument("--json", default=None, help="also write the results here")
    opts = p.parse_args(argv)
    from shmcoll._core.sizes import parse_size
    try:
        sizes = [parse_size(s) for s in opts.sizes]
        envs = _env(opts.a_env), _env(opts.b_env)
    except ValueError as e:
        p.error(str(e))
    results = {}
    print(f"{'benchmark':<40} {'A':<22} {'B':<22} {'B/A':>7}  pairs (B/A)")
    for world in opts.worlds:
        sides = [Side("A", world, opts.a_python, envs[0]),
                 Side("B", world, opts.b_python, envs[1])]
        try:
            for case in suite([world], sizes, opts.collectives):
                (ratio, ratios, algo_a, algo_b), = compare([case], sides, opts.pairs).values()
                name = _name(case)
                results[name] = {"ratio": ratio, "pairs": ratios, "a": algo_a, "b": algo_b}
                flag = "  SLOWER" if slower(ratios, opts.threshold) else ""
                spread = " ".join(f"{r:.2f}" for r in ratios)
                print(f"{name:<40} {algo_a:<22} {algo_b:<22} {ratio:>7.3f}  {spread}{flag}",
                      flush=True)
        except SideExited as e:
            print(f"shmcoll bench-ab: {e}", file=sys.stderr)
            return 2
        finally:
            for s in sides:
                s.close()
    flagged = [n for n, r in results.items() if slower(r["pairs"], opts.threshold)]
    changes = sorted(abs(r["ratio"] - 1) * 100 for r in results.values())
    print(f"# median |B/A - 1| {changes[len(changes) // 2]:.1f}%; {len(flagged)} of {len(results)} "
          f"benchmarks slower by more than {opts.threshold:g}% on B in 3/4 of their pairs")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if flagged else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    else:
        sys.exit(main(sys.argv[1:]))
