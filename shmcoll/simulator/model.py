"""Prices an algorithm's rounds (algorithms.rounds) on a Cluster.

Each round costs the latency of the slowest level it crosses; each stage (rounds
that overlap) costs, per byte of n, its most loaded link's bytes over that link's
bandwidth; reduction costs γ per byte the busiest rank combines:

    time(n) = Σ_rounds latency + n · Σ_stages max_link(share/bandwidth) + n · γ · reduced

— the α-β-γ formula of the selector (algorithms.terms) with α and β read off the
links each step crosses.  On one level of identical links it is exactly
α·steps + β·(busiest rank's bytes one way per stage) + γ·reduced.
"""
from dataclasses import dataclass

import numpy as np

from shmcoll.collectives import bus_factor
from shmcoll.tuning.algorithms import REGISTRY
from shmcoll.tuning.algorithms.direct import WITH_THE_RECORDS
from shmcoll.tuning.algorithms.rounds import Round, per_rank_totals


@dataclass(frozen=True)
class Step:
    index: int
    stage: int
    flows: int
    crosses_nodes: bool
    latency: float
    bottleneck: str         # the most loaded link of this round
    per_byte: float         # its seconds per byte of n, this round alone


@dataclass(frozen=True)
class Priced:
    """One algorithm variant on one cluster and rank order; prices any size."""
    collective: str
    algorithm: str
    variant: str
    world: int
    latency: float          # seconds, whatever the size
    per_byte: float         # seconds per byte of n: the stages' bottlenecks
    reduce_per_byte: float  # γ · the busiest rank's reduced share
    steps: tuple
    stage_bottlenecks: tuple   # (stage, link, seconds per byte) per stage

    @property
    def label(self):
        return self.algorithm if self.variant == self.algorithm else f"{self.algorithm} ({self.variant})"

    def seconds(self, nbytes):
        return self.latency + nbytes * (self.per_byte + self.reduce_per_byte)

    def bottleneck(self):
        """The link of the stage that costs the most per byte."""
        return max(self.stage_bottlenecks, key=lambda s: s[2])[1] if self.stage_bottlenecks else "-"


def price(collective, algorithm, variant, cluster, order="node-aware"):
    alg = REGISTRY[algorithm]
    world = cluster.world
    rounds = alg.rounds(collective, world, variant) if world > 1 else []
    device = cluster.placement(order)
    on_devices = [Round(device[r.src], device[r.dst], r.share, r.reduces, r.stage)
                  for r in rounds]
    return price_rounds(collective, algorithm, variant, on_devices, cluster)


def price_rounds(collective, algorithm, variant, rounds, cluster):
    """A Priced for `rounds` whose ranks are already the cluster's devices."""
    bandwidth = cluster.resource_bandwidths()
    stage_load = {}
    steps = []
    latency = 0.0
    for i, r in enumerate(rounds):
        first, second, crosses = cluster.flow_resources(r.src, r.dst)
        load = np.bincount(np.concatenate([first, second]), np.concatenate([r.share, r.share]),
                           len(bandwidth))
        stage_load[r.stage] = stage_load.get(r.stage, 0.0) + load
        slowest = cluster.inter if crosses.any() else cluster.intra
        latency += slowest.latency
        worst = int(np.argmax(load / bandwidth))
        steps.append(Step(i, r.stage, r.flows, bool(crosses.any()), slowest.latency,
                          cluster.resource_name(worst), load[worst] / bandwidth[worst]))
    stages = []
    for stage, load in sorted(stage_load.items()):
        worst = int(np.argmax(load / bandwidth))
        stages.append((stage, cluster.resource_name(worst), load[worst] / bandwidth[worst]))
    reduced = per_rank_totals(rounds, cluster.world)[1].max() if rounds else 0.0
    return Priced(collective, algorithm, variant, cluster.world, latency,
                  sum(s[2] for s in stages), cluster.gamma * reduced, tuple(steps), tuple(stages))


def simulated_variants(alg, collective, world):
    """The variants of `alg` the simulator prices: all but direct's inline and eager
    ones, whose parts go with the call records of one node's shared memory, on no link
    (eager is not listed at 1 byte: it is left out by that too)."""
    return [v for v, _, _ in alg.variants(collective, world, 1) if v not in WITH_THE_RECORDS]


def candidates(collective, cluster, order="node-aware", algorithms=None):
    """Every variant of every algorithm implementing `collective` (or of `algorithms`),
    priced: the simulator's cost table, before the argmin.  On several nodes the
    hierarchical compositions (simulator.hierarchy) are candidates too."""
    out = []
    for name, alg in REGISTRY.items():
        if collective in alg.COLLECTIVES and (algorithms is None or name in algorithms):
            for variant in simulated_variants(alg, collective, max(cluster.world, 2)):
                out.append(price(collective, name, variant, cluster, order))
    if cluster.nodes > 1 and cluster.per_node > 1:
        from shmcoll.simulator import hierarchy
        names = [n for n in hierarchy.COMPOSITIONS.get(collective, {})
                 if algorithms is None or n in algorithms]
        if names:
            out += hierarchy.candidates(collective, cluster, order, names)
    if not out:
        raise ValueError(f"no algorithm among {algorithms} implements {collective}")
    return out


@dataclass(frozen=True)
class Result:
    size: int
    priced: Priced
    seconds: float
    algbw: float            # bytes per second
    busbw: float


def result(priced, nbytes):
    seconds = priced.seconds(nbytes) if priced.world > 1 else 0.0
    algbw = nbytes / seconds if seconds > 0 else float("inf")
    return Result(nbytes, priced, seconds, algbw,
                  algbw * bus_factor(priced.collective, priced.world))


def simulate(collective, sizes, cluster, algorithm="auto", order="node-aware"):
    """[Result] per size: the named algorithm's cheapest variant at each size, or
    with 'auto' the cheapest of all (the selector's argmin over its cost table)."""
    pool = candidates(collective, cluster, order, None if algorithm == "auto" else (algorithm,))
    return [result(min(pool, key=lambda p: p.seconds(n)), n) for n in sizes]


def crossover(small, large):
    """The size n at which `large` (less per byte) starts to beat `small` (less latency):
    the root of small.seconds(n) = large.seconds(n); None if one always wins."""
    slope = (small.per_byte + small.reduce_per_byte) - (large.per_byte + large.reduce_per_byte)
    gap = large.latency - small.latency
    if slope <= 0 or gap <= 0:
        return None
    return gap / slope
