"""The α-β(-γ) model beyond one machine: the engine's schedules (algorithms.rounds)
priced on a modelled cluster of nodes × devices with two levels of links.

    from shmcoll.simulator import Cluster, PRESETS, simulate
    c = Cluster(nodes=2, per_node=8, intra=PRESETS["nvlink4"], inter=PRESETS["ib-ndr"])
    for r in simulate("allreduce", [1 << 20, 1 << 30], c, algorithm="ring", order="interleaved"):
        print(r.size, r.seconds, r.busbw, r.priced.bottleneck())
"""
from shmcoll.simulator.cluster import ORDERS, PRESETS, Cluster, Link, parse_link
from shmcoll.simulator.model import Priced, Result, candidates, crossover, price, simulate

__all__ = ["ORDERS", "PRESETS", "Cluster", "Link", "parse_link", "Priced", "Result",
           "candidates", "crossover", "price", "simulate"]
