"""Ring algorithms (Patarasuk & Yuan 2009), pipelined in slot-sized chunks.

ReduceScatter: P-1 steps; at step k rank r sends block r-k-1 to r+1 and reduces the
block it receives with its own.  AllGather: P-1 steps forwarding finished blocks.
AllReduce = ReduceScatter + AllGather (Theorem 1), 2(P-1) steps of n/P bytes.
Implemented in C (csrc/sc_ring.c); costs from Thakur, Rabenseifner & Gropp (2005):

    allreduce       2(P-1)·α + 2·n·(P-1)/P·β + n·(P-1)/P·γ     (optimal bandwidth term)
    reduce_scatter   (P-1)·α +   n·(P-1)/P·β + n·(P-1)/P·γ     (n = input bytes)
    allgather        (P-1)·α +   n·(P-1)/P·β                   (n = gathered bytes)
"""

NAME = "ring"
CODE = 0
DESCRIPTION = "bandwidth-optimal pipelined ring (ReduceScatter + AllGather)"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def cost(collective, world, nbytes, model):
    """Modelled seconds for `collective` on `nbytes` over `world` ranks."""
    p, n = world, float(nbytes)
    if p == 1:
        return 0.0
    share = n * (p - 1) / p
    if collective == "allreduce":
        return 2 * (p - 1) * model.alpha + 2 * share * model.beta + share * model.gamma
    if collective == "reduce_scatter":
        return (p - 1) * model.alpha + share * model.beta + share * model.gamma
    if collective == "allgather":
        return (p - 1) * model.alpha + share * model.beta
    raise ValueError(f"ring does not implement {collective}")
