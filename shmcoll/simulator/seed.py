"""The seed's three claims, reproduced by the simulator (`shmcoll simulate --reproduce`).

Each function returns its figures and the lines that explain them; tests check the
figures, the command prints the lines.
"""
from dataclasses import dataclass

import numpy as np

from shmcoll._core.sizes import human_size
from shmcoll.simulator.cluster import PRESETS, Cluster, Link
from shmcoll.simulator.model import crossover as crossing, price
from shmcoll.tuning.algorithms.terms import log2_ceil


@dataclass(frozen=True)
class Reproduction:
    figures: dict
    lines: list


def flat(world, alpha, beta):
    """One level of identical links: latency α per step, β seconds per byte."""
    return Cluster(1, world, Link(1.0 / beta, alpha, f"alpha {alpha * 1e6:g} us, beta {beta * 1e9:g} ns/B"))


def tree_ring_crossover(world=16, alpha=1e-6, beta=1e-9):
    """The size above which ring AllReduce beats the binomial tree AllReduce."""
    cluster = flat(world, alpha, beta)
    tree = price("allreduce", "tree", "binomial", cluster)
    ring = price("allreduce", "ring", "ring", cluster)
    exact = crossing(tree, ring)
    depth = log2_ceil(world)
    closed = alpha * (2 * (world - 1) - 2 * depth) / (beta * (depth - 2 * (world - 1) / world))
    seed = alpha * world / beta
    lines = [
        f"tree vs ring AllReduce, P={world}, alpha={alpha * 1e6:g} us, beta={beta * 1e9:g} ns/B",
        f"  tree: {tree.latency * 1e6:g} us + {tree.per_byte * 1e9:g} ns/B x M   "
        f"(2L steps, L={depth}; reduce and broadcast overlap, the root sends and receives L*M)",
        f"  ring: {ring.latency * 1e6:g} us + {ring.per_byte * 1e9:g} ns/B x M   "
        f"(2(P-1) steps of M/P)",
        f"  M* = alpha(2(P-1) - 2L) / beta(L - 2(P-1)/P) = {exact:,.0f} bytes ({exact / 1024:.2f} KiB)",
        f"  alpha*P/beta = {seed:,.0f} bytes: M*/(alpha P/beta) = {exact / seed:.3f}",
        "  why: for large P, M* ~ 2P alpha / ((log2 P - 2) beta); at P=16 (log2 P - 2 = 2) that",
        "  leading term is exactly alpha*P/beta, the seed's figure; the lower-order terms",
        f"  (-2 alpha, -2L alpha above, +2 beta/P below) bring it to {exact / seed:.2f}x. As P grows",
        "  M*/(alpha P/beta) -> 2/(log2 P - 2): the crossover grows slower than P.",
        f"  below {exact:,.0f} B the tree wins, above it the ring.",
    ]
    return Reproduction({"crossover": exact, "closed_form": closed, "alpha_p_over_beta": seed,
                         "tree": tree, "ring": ring}, lines)


def node_aware_ring(nodes=2, per_node=8, intra=PRESETS["nvlink4"], inter=PRESETS["ib-ndr"],
                    nics=1, sizes=(8, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30)):
    """Ring AllReduce with ranks of a node consecutive vs interleaved across nodes."""
    cluster = Cluster(nodes, per_node, intra, inter, nics)
    aware = price("allreduce", "ring", "ring", cluster, "node-aware")
    mixed = price("allreduce", "ring", "ring", cluster, "interleaved")
    rows = [(n, aware.seconds(n), mixed.seconds(n)) for n in sizes]
    limit = mixed.per_byte / aware.per_byte
    lines = [f"ring AllReduce, {cluster.describe()}",
             f"  {'size':>8} {'node-aware us':>14} {'interleaved us':>15} {'speedup':>8}"]
    lines += [f"  {human_size(n):>8} {a * 1e6:>14.2f} {m * 1e6:>15.2f} {m / a:>7.2f}x"
              for n, a, m in rows]
    aware_step, mixed_step = aware.steps[0], mixed.steps[0]
    lines += [
        f"  each step: node-aware {_crossing_flows(cluster, 'node-aware')} flow(s) cross "
        f"each node boundary, interleaved {_crossing_flows(cluster, 'interleaved')};",
        f"    bottleneck node-aware: {aware_step.bottleneck}; interleaved: {mixed_step.bottleneck}",
        f"  large messages: speedup -> {limit:.2f}x = the flows sharing each NIC per step "
        f"(interleaved: every one of a node's {per_node} ranks sends off-node; node-aware: one)",
        "  small messages: ~1x: every ring step of either order waits for an inter-node hop,",
        "    so both pay 2(P-1) network latencies; ring order buys bandwidth, not latency.",
    ]
    if nics >= per_node:
        lines.append("  (one NIC per device: interleaved flows no longer share a card)")
    return Reproduction({"rows": rows, "large_message_speedup": limit,
                         "aware": aware, "interleaved": mixed}, lines)


def _crossing_flows(cluster, order):
    """Ring flows leaving each node per step (rank r sends to r+1)."""
    node = cluster.placement(order) // cluster.per_node
    return int((node != np.roll(node, -1)).sum()) // cluster.nodes


def ring_asymptote(alpha=1e-6, beta=1e-9, nbytes=1 << 30, worlds=(2, 4, 8, 16, 64, 256, 1024)):
    """Ring AllReduce time against the 2βM lower bound as P grows."""
    bound = 2 * beta * nbytes
    rows = []
    for world in worlds:
        ring = price("allreduce", "ring", "ring", flat(world, alpha, beta))
        rows.append((world, ring.seconds(nbytes), ring.per_byte * nbytes, ring.latency))
    lines = [f"ring AllReduce of M = {human_size(nbytes)}, alpha={alpha * 1e6:g} us, "
             f"beta={beta * 1e9:g} ns/B: 2 beta M = {bound * 1e3:.3f} ms",
             f"  {'P':>5} {'time ms':>10} {'bandwidth ms':>13} {'latency ms':>11} "
             f"{'time/2bM':>9} {'(P-1)/P':>9}"]
    lines += [f"  {w:>5} {t * 1e3:>10.3f} {b * 1e3:>13.3f} {lat * 1e3:>11.3f} "
              f"{t / bound:>9.4f} {(w - 1) / w:>9.4f}" for w, t, b, lat in rows]
    lines.append("  the bandwidth term 2(P-1)/P x beta M -> 2 beta M (every rank must send and "
                 "receive ~M); the latency term 2(P-1) alpha grows with P and dominates when "
                 "M < P alpha/beta")
    return Reproduction({"rows": rows, "bound": bound}, lines)


REPRODUCTIONS = {
    "crossover": tree_ring_crossover,
    "node-aware": node_aware_ring,
    "asymptote": ring_asymptote,
}
