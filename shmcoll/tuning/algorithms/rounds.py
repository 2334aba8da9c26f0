"""A schedule as rounds of flows: who sends how much to whom, step by step.

The cost terms of an algorithm (algorithms.terms.Terms) summarise its schedule for
one kind of link; the rounds keep the whole pattern, so the simulator
(shmcoll.simulator) can price every flow on the link it crosses.  Both live in the
algorithm's module and are tested to agree: len(rounds) = Terms.steps, the busiest
rank's sent + received bytes = Terms.moved, its reduced bytes = Terms.reduced.  A fanned
round's sender writes what all its flows carry once, every receiver reading it there
(the direct schedules' fan-out): its sent bytes count once, not once per flow.

A flow's size is a fraction of the collective's n bytes (as in shmcoll.collectives), so one
list of rounds prices every size.  Rounds of one `stage` overlap chunk by chunk (the
engine pipelines chains and trees): they pay each round's latency but share the
links' bandwidth; consecutive stages run one after the other.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Round:
    src: np.ndarray         # sending ranks
    dst: np.ndarray         # receiving ranks, flow by flow
    share: np.ndarray       # bytes of each flow, as a fraction of n
    reduces: bool           # receivers combine what they receive
    stage: int              # rounds of one stage overlap
    fanned: bool = False    # each sender's flows carry the same bytes, written once

    @property
    def flows(self):
        return len(self.src)


def make_round(src, dst, share, reduces=False, stage=0, fanned=False):
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    share = np.broadcast_to(np.asarray(share, dtype=np.float64), src.shape).copy()
    return Round(src, dst, share, reduces, stage, fanned)


def ring_round(world, share, reduces, stage):
    """Every rank r sends `share` to r+1."""
    src = np.arange(world)
    return make_round(src, (src + 1) % world, share, reduces, stage)


def all_pairs_round(world, share, reduces, stage=0, fanned=False):
    """Every rank sends `share` to every other rank (fanned: the same bytes to all)."""
    src, dst = np.meshgrid(np.arange(world), np.arange(world), indexing="ij")
    mask = src != dst
    return make_round(src[mask], dst[mask], share, reduces, stage, fanned)


def star_round(world, share, inward, reduces=False, stage=0, fanned=False):
    """Rank 0 to every other rank (inward: every other rank to rank 0; fanned: the
    same bytes to all)."""
    leaves = np.arange(1, world)
    root = np.zeros_like(leaves)
    return make_round(leaves, root, share, reduces, stage) if inward else \
        make_round(root, leaves, share, reduces, stage, fanned)


def per_rank_totals(rounds, world):
    """(sent + received, reduced) bytes per rank over `rounds`, as fractions of n."""
    moved = np.zeros(world)
    reduced = np.zeros(world)
    for r in rounds:
        if r.fanned:
            sent = np.zeros(world)
            np.maximum.at(sent, r.src, r.share)
        else:
            sent = np.bincount(r.src, r.share, world)
        moved += sent + np.bincount(r.dst, r.share, world)
        if r.reduces:
            reduced += np.bincount(r.dst, r.share, world)
    return moved, reduced
