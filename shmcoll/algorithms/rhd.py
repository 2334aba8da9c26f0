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
from shmcoll.algorithms.terms import Terms, pow2_floor

NAME = "rhd"
CODE_DOUBLING = 4
CODE_HALVING = 5
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
