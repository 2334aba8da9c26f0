"""Binomial trees (the seed's O(log P) latency algorithm), pipelined in chunks.

Rank v (renumbered from the root) has parent v minus its lowest set bit, so the
tree is L = ⌈log2 P⌉ deep and the root has L children.  Broadcast and Scatter flow
down it, Reduce and Gather up it; AllReduce is a Reduce to rank 0 overlapped, chunk
by chunk, with the Broadcast of the finished chunks.  C: csrc/sc_rooted.c.
With L = ⌈log2 P⌉ and n as in shmcoll.collectives:

    broadcast          L·α +  L·o +     n·L·β
    reduce             L·α +  L·o +     n·L·β + n·L·γ
    gather, scatter    L·α +  L·o + n(P-1)/P·β
    allreduce         2L·α + 2L·o +    2n·L·β + n·L·γ
(β per byte copied by the busiest rank, the root: it sends or receives n per child.)
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import make_round
from shmcoll.tuning.algorithms.terms import Terms, log2_ceil

NAME = "tree"
CODE = SCHEDULE_CODES["tree"]
DESCRIPTION = "binomial trees: log2(P) steps; AllReduce = Reduce + Broadcast, pipelined"
COLLECTIVES = ("allreduce", "broadcast", "reduce", "gather", "scatter")


def variants(collective, world, nbytes):
    p, n, depth = world, float(nbytes), log2_ceil(world)
    terms = {
        "broadcast": Terms(depth, depth, n * depth, 0),
        "reduce": Terms(depth, depth, n * depth, n * depth),
        "gather": Terms(depth, depth, n * (p - 1) / p, 0),
        "scatter": Terms(depth, depth, n * (p - 1) / p, 0),
        "allreduce": Terms(2 * depth, 2 * depth, 2 * n * depth, n * depth),
    }
    if collective not in terms:
        raise ValueError(f"tree does not implement {collective}")
    return [("binomial", CODE, terms[collective])]


def _levels(world):
    """Per level j, leaves first: the ranks whose parent is 2^j below them, and the
    sizes of their subtrees."""
    levels = []
    for j in range(log2_ceil(world)):
        ranks = [v for v in range(1, world) if v & -v == 1 << j]
        levels.append((ranks, [min(1 << j, world - v) for v in ranks]))
    return levels


def rounds(collective, world, variant=None):
    """The schedule as rounds (algorithms.rounds), root 0, all levels overlapping:
    leaves first going up (reduce, gather), the root's children first going down."""
    up = [(ranks, [v - (v & -v) for v in ranks], sizes) for ranks, sizes in _levels(world)]
    if collective in ("reduce", "allreduce"):
        out = [make_round(src, dst, 1.0, reduces=True) for src, dst, _ in up]
        if collective == "allreduce":
            out += [make_round(dst, src, 1.0) for src, dst, _ in reversed(up)]
        return out
    if collective == "broadcast":
        return [make_round(dst, src, 1.0) for src, dst, _ in reversed(up)]
    if collective == "gather":
        return [make_round(src, dst, [s / world for s in sizes]) for src, dst, sizes in up]
    if collective == "scatter":
        return [make_round(dst, src, [s / world for s in sizes])
                for src, dst, sizes in reversed(up)]
    raise ValueError(f"tree does not implement {collective}")
