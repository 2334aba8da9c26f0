"""Direct (one-shot) AllReduce over shared memory.

Every rank publishes its vector to every peer, then reduces all P vectors itself
in rank order 0..P-1 (so every rank gets the same bits).  One synchronisation
instead of the ring's 2(P-1) chained steps, at the price of P-1 copies out and
P-1 vectors read and reduced by every rank.  Implemented in C (csrc/sc_direct.c):

    allreduce   α + 2·(P-1)·n·β + (P-1)·n·γ
"""

NAME = "direct"
CODE = 1
DESCRIPTION = "one-shot: every rank reads all peers' vectors and reduces (latency-optimal)"
COLLECTIVES = ("allreduce",)


def cost(collective, world, nbytes, model):
    p, n = world, float(nbytes)
    if p == 1:
        return 0.0
    if collective == "allreduce":
        return model.alpha + 2 * (p - 1) * n * model.beta + (p - 1) * n * model.gamma
    raise ValueError(f"direct does not implement {collective}")
