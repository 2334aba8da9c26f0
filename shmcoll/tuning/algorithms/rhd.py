"""Recursive halving and doubling (Thakur, Rabenseifner & Gropp 2005): AllReduce,
ReduceScatter and AllGather.

Over p2, the largest power of two <= P, with k = log2 p2 steps:
  doubling     partners v, v^2^i swap whole vectors and both merge: k steps of n
  halving      Rabenseifner: recursive-halving ReduceScatter (n/2 + n/4 + …) then
               recursive-doubling AllGather: 2k steps, 2n(p2-1)/p2 bytes
When P is not a power of two, the first 2(P-p2) ranks pair up before and after
(one more step each way, n bytes each).  ReduceScatter is the halving half and
AllGather the doubling half, over real blocks (virtual rank v's piece is the blocks
of the ranks it stands for, so pieces differ when P is not a power of two): their
terms are read off their rounds.  C: csrc/sc_rhd.c.

    doubling    k·α +  k·o +       2n·k·β +      n·k·γ   (+ fold)
    halving    2k·α + 2k·o + 4n(p2-1)/p2·β + n(p2-1)/p2·γ (+ fold)
    fold        2·α +  2·o +          2n·β +          n·γ  (P not a power of two)
    reduce_scatter   k·α + k·o + 2n(p2-1)/p2·β + n(p2-1)/p2·γ    (P a power of two)
    allgather        k·α + k·o + 2n(p2-1)/p2·β
(β per byte copied: every swap sends and receives the same amount.)
"""
from functools import lru_cache

from shmcoll.tuning.algorithms.rounds import per_rank_totals
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import make_round
from shmcoll.tuning.algorithms.terms import Terms, pow2_floor

NAME = "rhd"
CODE_DOUBLING = SCHEDULE_CODES["rhd_doubling"]
CODE_HALVING = SCHEDULE_CODES["rhd_halving"]
CODE = CODE_DOUBLING
DESCRIPTION = "recursive doubling (small) / Rabenseifner halving-doubling (large) AllReduce"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
# the one variant of each half, and its engine code
_HALVES = {"reduce_scatter": ("halving", CODE_HALVING), "allgather": ("doubling", CODE_DOUBLING)}


@lru_cache(maxsize=256)
def _half_terms(collective, world):
    """Terms per byte of a half, summarised from its rounds."""
    rounds_ = rounds(collective, world)
    moved, reduced = per_rank_totals(rounds_, world)
    return Terms(len(rounds_), len(rounds_), float(moved.max()), float(reduced.max()))


def variants(collective, world, nbytes):
    if collective in _HALVES:
        variant, code = _HALVES[collective]
        t = _half_terms(collective, world)
        return [(variant, code, Terms(t.steps, t.messages, t.moved * nbytes,
                                      t.reduced * nbytes))]
    if collective != "allreduce":
        raise ValueError(f"rhd does not implement {collective}")
    n, p2 = float(nbytes), pow2_floor(world)
    k = p2.bit_length() - 1
    fold = Terms(2, 2, 2 * n, n) if p2 != world else Terms()
    share = n * (p2 - 1) / p2
    return [("doubling", CODE_DOUBLING, Terms(k, k, 2 * n * k, n * k) + fold),
            ("halving", CODE_HALVING, Terms(2 * k, 2 * k, 4 * share, share) + fold)]


def _half_rounds(collective, world):
    """ReduceScatter (halving) or AllGather (doubling) over real blocks."""
    p2 = pow2_floor(world)
    rem = world - p2
    real = [2 * v + 1 if v < rem else v + rem for v in range(p2)]
    evens = [2 * i for i in range(rem)]

    def first(v):       # the first real block of virtual rank v's piece
        return 2 * v if v < rem else v + rem

    def piece(b0, b1):  # pieces [b0, b1) as a share of the vector
        return (first(b1) - first(b0)) / world

    out = []
    if collective == "reduce_scatter":
        if rem:
            out.append(make_round(evens, [e + 1 for e in evens], 1.0, True, stage=0))
        lo, hi = [0] * p2, [p2] * p2
        mask = p2 // 2
        while mask >= 1:
            shares = []
            for v in range(p2):
                mid = lo[v] + (hi[v] - lo[v]) // 2
                keep_low = not v & mask
                shares.append(piece(mid, hi[v]) if keep_low else piece(lo[v], mid))
                lo[v], hi[v] = (lo[v], mid) if keep_low else (mid, hi[v])
            out.append(make_round(real, [real[v ^ mask] for v in range(p2)], shares, True,
                                  stage=len(out)))
            mask //= 2
        if rem:
            out.append(make_round([e + 1 for e in evens], evens, 1.0 / world, stage=len(out)))
        return out
    if rem:
        out.append(make_round(evens, [e + 1 for e in evens], 1.0 / world, stage=0))
    mask = 1
    while mask < p2:
        shares = [piece(v & ~(mask - 1), (v & ~(mask - 1)) + mask) for v in range(p2)]
        out.append(make_round(real, [real[v ^ mask] for v in range(p2)], shares, False,
                              stage=len(out)))
        mask *= 2
    if rem:
        out.append(make_round([e + 1 for e in evens], evens, 1.0, stage=len(out)))
    return out


def rounds(collective, world, variant="halving"):
    """The schedule as rounds (algorithms.rounds); every swap waits for the one
    before it, so each round is its own stage.  Ranks are real ranks: virtual rank v
    is 2v+1 among the folded pairs, v + (P - p2) after them (csrc/sc_rhd.c)."""
    if collective in _HALVES:
        return _half_rounds(collective, world)
    if collective != "allreduce":
        raise ValueError(f"rhd does not implement {collective}")
    p2 = pow2_floor(world)
    rem = world - p2
    virtual = list(range(p2))
    real = [2 * v + 1 if v < rem else v + rem for v in virtual]
    evens = [2 * i for i in range(rem)]
    out = []
    if rem:
        out.append(make_round(evens, [e + 1 for e in evens], 1.0, True, stage=0))

    def swap(mask, share, reduces):
        out.append(make_round(real, [real[v ^ mask] for v in virtual], share, reduces,
                              stage=len(out)))

    masks = [1 << i for i in range(p2.bit_length() - 1)]
    if variant == "doubling":
        for mask in masks:
            swap(mask, 1.0, True)
    else:
        for mask in reversed(masks):
            swap(mask, mask / p2, True)
        for mask in masks:
            swap(mask, mask / p2, False)
    if rem:
        out.append(make_round([e + 1 for e in evens], evens, 1.0, False, stage=len(out)))
    return out
