"""`shmcoll simulate`: collectives on a modelled cluster (nodes x devices, two levels of
links), priced from the same schedules the engine runs.

  shmcoll simulate allreduce --nodes 2 --per-node 8 --intra nvlink4 --inter ib-ndr
  shmcoll simulate allreduce --nodes 1 --per-node 16 --intra 1GB/s:1us --algo tree,ring
  shmcoll simulate allreduce --nodes 2 --per-node 8 --algo hierarchical,leader,ring
  shmcoll simulate --reproduce crossover|node-aware|asymptote

Links: nvlink4 (600 GB/s), pcie5 (64 GB/s), ib-ndr (50 GB/s), or BANDWIDTH[:LATENCY].
For each size: the modelled time of every algorithm (or one, --algo NAME), the
fastest, its algbw and busbw (nccl-tests factors) and the link that bounds it;
--steps adds each step's bottleneck link at the largest size.  On several nodes the
hierarchical compositions shmcoll.mpi runs (hierarchical, leader) are priced beside the
flat schedules, each phase with its cheapest algorithm (simulator.hierarchy).
"""
import argparse

from shmcoll._core.sizes import human_size, parse_size
from shmcoll.collectives import NAMES as ALL_COLLECTIVES
from shmcoll.simulator import hierarchy, seed
from shmcoll.simulator.cluster import ORDERS, Cluster, parse_link
from shmcoll.simulator.model import candidates, crossover, result
from shmcoll.tools.harness import size_sweep
from shmcoll.tuning.selector import algorithms_for

HELP = "collectives on a modelled multi-node cluster (alpha-beta)"


def parser():
    p = argparse.ArgumentParser(prog="shmcoll simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", nargs="?", default="allreduce", choices=ALL_COLLECTIVES)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--per-node", type=int, default=8, help="devices (ranks) per node")
    p.add_argument("--intra", type=parse_link, default="nvlink4", help="link inside a node")
    p.add_argument("--inter", type=parse_link, default="ib-ndr", help="link between nodes")
    p.add_argument("--nics", type=int, default=1, help="network cards per node")
    p.add_argument("--reduce-bw", type=parse_link, default=None, metavar="BW",
                   help="bytes per second one rank reduces (default: reduction is free)")
    p.add_argument("--order", choices=ORDERS, default="node-aware", help="rank order")
    p.add_argument("--algo", default="all", help="NAME, several as tree,ring, auto (the cheapest) or all (default)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("-f", "--stepfactor", dest="factor", type=float, default=4.0)
    p.add_argument("--steps", action="store_true",
                   help="each step's bottleneck link, at the largest size")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="busbw against size per algorithm, crossovers marked (needs matplotlib)")
    p.add_argument("--reproduce", choices=tuple(seed.REPRODUCTIONS), default=None,
                   help="print one of the seed's claims as the model computes it")
    return p


def main(argv):
    p = parser()
    opts = p.parse_args(argv)
    if opts.reproduce:
        print("\n".join(seed.REPRODUCTIONS[opts.reproduce]().lines))
        return 0
    try:
        cluster = Cluster(opts.nodes, opts.per_node, opts.intra, opts.inter, opts.nics,
                          1.0 / opts.reduce_bw.bandwidth if opts.reduce_bw else 0.0)
        sizes = size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    except ValueError as e:
        p.error(str(e))
    only = None if opts.algo in ("all", "auto") else tuple(opts.algo.split(","))
    known = algorithms_for(opts.collective)
    if opts.nodes > 1 and opts.per_node > 1:
        known += list(hierarchy.COMPOSITIONS.get(opts.collective, {}))
    unknown = set(only or ()) - set(known)
    if unknown:
        p.error(f"--algo {opts.algo}: choose from "
                f"{', '.join(known + ['auto', 'all'])} "
                f"(or several, comma-separated)")
    if opts.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install 'shmcoll[plot]')")
    pool = candidates(opts.collective, cluster, opts.order, only)
    print(f"# shmcoll simulate {opts.collective}: {cluster.describe()}; order {opts.order}")
    rows = table(pool, sizes, show_each=opts.algo != "auto" and len(pool) > 1)
    print("\n".join(rows))
    winners = [min(pool, key=lambda c: c.seconds(n)) for n in sizes]
    marks = crossovers(winners)
    for size, label in marks:
        print(f"# crossover: {label} at {size:,.0f} B")
    if opts.steps:
        print("\n".join(step_lines(winners[-1], sizes[-1])))
    if opts.plot:
        plot(pool, sizes, marks, opts, cluster)
        print(f"# plot written to {opts.plot}")
    return 0


def best_of_each(pool, nbytes):
    """{algorithm: its cheapest variant at nbytes}."""
    best = {}
    for c in pool:
        if c.algorithm not in best or c.seconds(nbytes) < best[c.algorithm].seconds(nbytes):
            best[c.algorithm] = c
    return best


def table(pool, sizes, show_each):
    names = list(dict.fromkeys(c.algorithm for c in pool)) if show_each else []
    wide = max(18, *(len(c.label) for c in pool))
    head = f"#{'size':>11} " + "".join(f"{n + ' us':>{max(12, len(n) + 4)}}" for n in names) + \
           f"  {'fastest':<{wide}} {'time us':>11} {'algbw GB/s':>10} {'busbw GB/s':>10}  bottleneck"
    lines = [head]
    for n in sizes:
        each = best_of_each(pool, n)
        fastest = min(each.values(), key=lambda c: c.seconds(n))
        r = result(fastest, n)
        lines.append(f"{human_size(n):>12} " +
                     "".join(f"{each[a].seconds(n) * 1e6:>{max(12, len(a) + 4)}.2f}" for a in names) +
                     f"  {fastest.label:<{wide}} {r.seconds * 1e6:>11.2f} {r.algbw / 1e9:>10.2f} "
                     f"{r.busbw / 1e9:>10.2f}  {fastest.bottleneck()}")
    return lines


def crossovers(winners):
    """[(size, 'a -> b')] where the fastest changes between consecutive sizes."""
    marks = []
    for before, after in zip(winners, winners[1:]):
        if before is not after:
            at = crossover(before, after)
            if at is not None:
                marks.append((at, f"{before.label} -> {after.label}"))
    return marks


def step_lines(priced, nbytes):
    lines = [f"# steps of {priced.label} at {human_size(nbytes)}: step, stage, flows, "
             f"latency, busiest link and its time this step"]
    for s in priced.steps:
        lines.append(f"  {s.index:>4} {s.stage:>4} {s.flows:>6} {s.latency * 1e6:>8.2f} us  "
                     f"{s.bottleneck:<36} {s.per_byte * nbytes * 1e6:>10.2f} us")
    for stage, link, per_byte in priced.stage_bottlenecks:
        lines.append(f"# stage {stage}: bounded by {link}, {per_byte * nbytes * 1e6:.2f} us")
    return lines


def plot(pool, sizes, marks, opts, cluster):
    from shmcoll.tools.plot import plot_busbw
    series = {}
    for n in (s for s in sizes if s > 0):
        for name, c in best_of_each(pool, n).items():
            series.setdefault(name, []).append((n, result(c, n).busbw / 1e9))
    plot_busbw(series, [(s, f"{label} at {s:,.0f} B") for s, label in marks], opts.plot,
               f"{opts.collective} (modelled), {cluster.nodes}x{cluster.per_node}, {opts.order}")
