"""Recursive halving and doubling AllReduce (Thakur, Rabenseifner & Gropp 2005).

Over p2, the largest power of two <= P, with k = log2 p2 steps:
  doubling     partners v, v^2^i swap whole vectors and both merge: k steps of n
  halving      Rabenseifner: recursive-halving ReduceScatter (n/2 + n/4 + …) then
               recursive-doubling AllGather: 2k steps, 2n(p2-1)/p2 bytes
When P is not a power of two, the first 2(P-p2) ranks pair up before and after
(one more step each way, n bytes each).  C: csrc/sc_rhd.c.

    doubling    k·α +  k·o +       2n·k·β +      n·k·γ   (+ fold)
    halving    2k·α + 2k·o + 4n(p2-1)/p2·β + n(p2-1)/p2·γ (+ fold)
    fold        2·α +  2·o +          2n·β +          n·γ  (P not a power of two)
(β per byte copied: every swap sends and receives the same amount.)
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import make_round
from shmcoll.tuning.algorithms.terms import Terms, pow2_floor

NAME = "rhd"
CODE_DOUBLING = SCHEDULE_CODES["rhd_doubling"]
CODE_HALVING = SCHEDULE_CODES["rhd_halving"]
CODE = CODE_DOUBLING
DESCRIPTION = "recursive doubling (small) / Rabenseifner halving-doubling (large) AllReduce"
COLLECTIVES = ("allreduce",)


def variants(collective, world, nbytes):
    if collective != "allreduce":
        raise ValueError(f"rhd does not implement {collective}")
    n, p2 = float(nbytes), pow2_floor(world)
    k = p2.bit_length() - 1
    fold = Terms(2, 2, 2 * n, n) if p2 != world else Terms()
    share = n * (p2 - 1) / p2
    return [("doubling", CODE_DOUBLING, Terms(k, k, 2 * n * k, n * k) + fold),
            ("halving", CODE_HALVING, Terms(2 * k, 2 * k, 4 * share, share) + fold)]


def rounds(collective, world, variant="halving"):
    """The schedule as rounds (algorithms.rounds); every swap waits for the one
    before it, so each round is its own stage.  Ranks are real ranks: virtual rank v
    is 2v+1 among the folded pairs, v + (P - p2) after them (csrc/sc_rhd.c)."""
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
