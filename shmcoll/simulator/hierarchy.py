"""Hierarchical schedules: a collective as phases on the levels of a cluster, each
phase one of the registered algorithms (algorithms.rounds) run on its groups at once.

  node     every node's ranks, all nodes at once (shared memory)
  cross    the ranks of one local index across the nodes, every index at once
  leaders  the first rank of each node
  world    all ranks in their placement (one flat schedule)

shmcoll.mpi.Communicator runs these compositions (node phases on the shared-memory
engine, the others on MPI) and picks among them with `choose`, so the figures of
`shmcoll simulate --nodes N` are those of what it runs.  With N nodes of L ranks and
n as in shmcoll.collectives:

  allreduce       hierarchical  node ReduceScatter n -> cross AllReduce n/L -> node AllGather n
                  leader        node Reduce n -> leaders AllReduce n -> node Broadcast n
  reduce_scatter  hierarchical  node ReduceScatter n -> cross ReduceScatter n/L
  allgather       hierarchical  cross AllGather n/L -> node AllGather n
                  leader        node Gather n/N -> leaders AllGather n -> node Broadcast n
  broadcast       leader        leaders Broadcast n -> node Broadcast n
  reduce          leader        node Reduce n -> leaders Reduce n
  gather          leader        node Gather n/N -> leaders Gather n
  scatter         leader        leaders Scatter n -> node Scatter n/N
  every one       flat          one schedule over all ranks (MPI's own, modelled)

In `hierarchical` every local rank crosses the network at once with its 1/L of the
vector (one crossing per byte per node, all NICs busy); in `leader` one rank per node
carries the whole vector.  A phase is priced on its own as the cheapest of its
algorithms (each level picks its own: the engine's selector inside a node, MPI's
across), and the phases of a composition run one after another.  Phases on MPI
(cross, leaders, flat) are priced unpipelined: MPI sends each step's message whole,
where the shared-memory engine overlaps a chain's or a tree's hops chunk by chunk.
"""
import itertools
from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np

from shmcoll.simulator.model import Priced, Step, price_rounds, simulated_variants
from shmcoll.tuning.algorithms import REGISTRY
from shmcoll.tuning.algorithms.rounds import Round


@dataclass(frozen=True)
class Phase:
    level: str                                  # node, cross, leaders or world
    collective: str
    fraction: Callable[[int, int], float]       # of n, given (nodes, per_node)


def _whole(nodes, per_node):
    return 1.0


def _per_local(nodes, per_node):
    return 1.0 / per_node


def _per_node(nodes, per_node):
    return 1.0 / nodes


COMPOSITIONS = {
    "allreduce": {
        "hierarchical": (Phase("node", "reduce_scatter", _whole),
                         Phase("cross", "allreduce", _per_local),
                         Phase("node", "allgather", _whole)),
        "leader": (Phase("node", "reduce", _whole), Phase("leaders", "allreduce", _whole),
                   Phase("node", "broadcast", _whole))},
    "reduce_scatter": {
        "hierarchical": (Phase("node", "reduce_scatter", _whole),
                         Phase("cross", "reduce_scatter", _per_local))},
    "allgather": {
        "hierarchical": (Phase("cross", "allgather", _per_local),
                         Phase("node", "allgather", _whole)),
        "leader": (Phase("node", "gather", _per_node), Phase("leaders", "allgather", _whole),
                   Phase("node", "broadcast", _whole))},
    "broadcast": {"leader": (Phase("leaders", "broadcast", _whole),
                             Phase("node", "broadcast", _whole))},
    "reduce": {"leader": (Phase("node", "reduce", _whole), Phase("leaders", "reduce", _whole))},
    "gather": {"leader": (Phase("node", "gather", _per_node), Phase("leaders", "gather", _whole))},
    "scatter": {"leader": (Phase("leaders", "scatter", _whole),
                           Phase("node", "scatter", _per_node))},
}
FLAT = "flat"


def names_for(collective):
    """The compositions of `collective`, flat last."""
    return list(COMPOSITIONS.get(collective, {})) + [FLAT]


def groups(level, cluster, placement):
    """The device lists of the groups a phase at `level` runs on at once."""
    nodes, local = cluster.nodes, cluster.per_node
    if level == "node":
        return [[j * local + i for i in range(local)] for j in range(nodes)]
    if level == "cross":
        return [[j * local + i for j in range(nodes)] for i in range(local)]
    if level == "leaders":
        return [[j * local for j in range(nodes)]]
    if level == "world":
        return [list(placement)]
    raise ValueError(f"unknown level {level!r}")


def phase_candidates(phase, cluster, placement):
    """Every algorithm variant of one phase, priced per byte of the composition's n
    on its groups running at once; a phase over groups of one rank is free."""
    members = groups(phase.level, cluster, placement)
    size = len(members[0])
    fraction = phase.fraction(cluster.nodes, cluster.per_node)
    if size == 1:
        return [Priced(phase.collective, "-", "-", cluster.world, 0.0, 0.0, 0.0, (), ())]
    out = []
    for name, alg in REGISTRY.items():
        if phase.collective not in alg.COLLECTIVES:
            continue
        for variant in simulated_variants(alg, phase.collective, size):
            rounds = [_on_groups(r, members, fraction, phase.level != "node", k)
                      for k, r in enumerate(alg.rounds(phase.collective, size, variant))]
            out.append(price_rounds(phase.collective, name, variant, rounds, cluster))
    return _undominated(out)


def _on_groups(r, members, fraction, whole=False, index=0):
    """One round of a group schedule, run by every group at once on its devices.
    whole: the round is a stage of its own (MPI sends each step's message whole,
    where the engine pipelines a chain or tree chunk by chunk)."""
    table = np.asarray(members, dtype=np.int64)             # (groups, size)
    src = table[:, r.src].reshape(-1)
    dst = table[:, r.dst].reshape(-1)
    share = np.tile(r.share * fraction, len(members))
    return Round(src, dst, share, r.reduces, index if whole else r.stage)


def _undominated(priced):
    """Drops variants no cheaper than another at every size (latency and per byte)."""
    def slope(p):
        return p.per_byte + p.reduce_per_byte
    return [p for p in priced
            if not any(q is not p and q.latency <= p.latency and slope(q) <= slope(p) and
                       (q.latency < p.latency or slope(q) < slope(p)) for q in priced)]


def compose(collective, name, parts):
    """One Priced for phases run one after another (parts: a Priced per phase)."""
    steps, stages, offset = [], [], 0
    for part in parts:
        steps += [Step(len(steps) + i, s.stage + offset, s.flows, s.crosses_nodes, s.latency,
                       s.bottleneck, s.per_byte) for i, s in enumerate(part.steps)]
        stages += [(st + offset, link, per) for st, link, per in part.stage_bottlenecks]
        offset += 1 + max((s.stage for s in part.steps), default=0)
    variant = "/".join(p.algorithm for p in parts if p.algorithm != "-") or "-"
    return Priced(collective, name, variant, parts[0].world if parts else 0,
                  sum(p.latency for p in parts), sum(p.per_byte for p in parts),
                  sum(p.reduce_per_byte for p in parts), tuple(steps), tuple(stages))


def candidates(collective, cluster, order="node-aware", names=None):
    """Every composition of `collective` (or of `names`) with every choice of its
    phases' algorithms, priced on `cluster`; flat is the registered algorithms over
    all ranks in `order`."""
    placement = _devices(cluster, order)
    out = []
    for name in names_for(collective):
        if names is not None and name not in names:
            continue
        if name == FLAT:
            out += _flat(collective, cluster, placement)
            continue
        per_phase = [phase_candidates(p, cluster, placement)
                     for p in COMPOSITIONS[collective][name]]
        out += [compose(collective, name, parts) for parts in itertools.product(*per_phase)]
    return out


def _devices(cluster, order):
    """The device of each rank: a Cluster order, or one device per rank (a job that
    leaves devices unused, as nodes of different sizes priced as the largest do)."""
    if isinstance(order, str):
        return cluster.placement(order)
    devices = np.asarray(order, dtype=np.int64)
    if len(set(devices.tolist())) != len(devices) or not all(0 <= devices) or \
            not all(devices < cluster.world):
        raise ValueError(f"a placement must name distinct devices below {cluster.world}")
    return devices


def _flat(collective, cluster, placement):
    """The registered algorithms over every rank of `placement`."""
    out = []
    world = len(placement)
    for name, alg in REGISTRY.items():
        if collective not in alg.COLLECTIVES:
            continue
        for variant in simulated_variants(alg, collective, max(world, 2)):
            rounds = [_on_groups(r, [placement], 1.0, True, k) for k, r in
                      enumerate(alg.rounds(collective, world, variant) if world > 1 else [])]
            out.append(price_rounds(collective, name, variant, rounds, cluster))
    return [Priced(p.collective, FLAT, p.label, world, p.latency, p.per_byte,
                   p.reduce_per_byte, p.steps, p.stage_bottlenecks) for p in _undominated(out)]


@dataclass(frozen=True)
class Choice:
    name: str                   # hierarchical, leader or flat
    priced: Priced              # its cheapest pricing at the size
    reason: str                 # algo=, or cost model
    table: Tuple[Tuple[str, float], ...]     # (name, modelled seconds) of every candidate

    def describe(self, nbytes):
        costs = ", ".join(f"{n} {s * 1e6:.2f}" for n, s in sorted(self.table, key=lambda t: t[1]))
        return (f"{self.priced.collective} {nbytes} B: {self.name} ({self.reason}); phases "
                f"{self.priced.variant}; modelled us: {costs}")


def choose(pool, nbytes, algo=None):
    """The composition that runs at nbytes: `algo` if named, else the cheapest.
    `pool`: candidates() of one collective (those the caller can run)."""
    best = {}
    for p in pool:
        if p.algorithm not in best or p.seconds(nbytes) < best[p.algorithm].seconds(nbytes):
            best[p.algorithm] = p
    table = tuple((n, p.seconds(nbytes)) for n, p in best.items())
    if algo is None or algo == "auto":
        pick = min(best.values(), key=lambda p: p.seconds(nbytes))
        return Choice(pick.algorithm, pick, "cost model", table)
    if algo not in best:
        raise ValueError(f"algo {algo!r} does not run {pool[0].collective} here; "
                         f"available: {', '.join(list(best) + ['auto'])}")
    return Choice(algo, best[algo], "algo=", table)
