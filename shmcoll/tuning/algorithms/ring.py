"""Ring (Patarasuk & Yuan 2009) and its chain relatives, pipelined in slot-sized chunks.

ReduceScatter: P-1 steps; at step k rank r sends block r-k-1 to r+1 and reduces the
block it receives with its own.  AllGather: P-1 steps forwarding finished blocks.
AllReduce = ReduceScatter + AllGather (Theorem 1), 2(P-1) steps of n/P bytes, the
bandwidth-optimal schedule.  Broadcast and Reduce run along the chain
root → root+1 → … (each rank sends n once; P-1 hops of latency, overlapped across
chunks).  C: csrc/sc_ring.c (ring), csrc/sc_rooted.c (chain).  n as in shmcoll.collectives:

    allreduce        2(P-1)·α + 2(P-1)·o + 4n(P-1)/P·β + n(P-1)/P·γ
    reduce_scatter    (P-1)·α +  (P-1)·o + 2n(P-1)/P·β + n(P-1)/P·γ
    allgather         (P-1)·α +  (P-1)·o + 2n(P-1)/P·β
    broadcast         (P-1)·α +       o +      c·n·β
    reduce            (P-1)·α +       o +      c·n·β +         n·γ
where c = 2 (a middle rank copies n in and n out), c = 1 when P = 2.  β prices
bytes copied (sent and received), so the classic sent-bytes terms appear doubled.
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import make_round, ring_round
from shmcoll.tuning.algorithms.terms import Terms

NAME = "ring"
CODE = SCHEDULE_CODES["ring"]
DESCRIPTION = "bandwidth-optimal pipelined ring (ReduceScatter + AllGather); chain for rooted ops"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def variants(collective, world, nbytes):
    """[(variant, engine code, Terms)] for `collective` on `nbytes` over `world` ranks."""
    p, n = world, float(nbytes)
    share = n * (p - 1) / p
    middle = 1 if p <= 2 else 2
    if collective == "allreduce":
        t = Terms(2 * (p - 1), 2 * (p - 1), 4 * share, share)
    elif collective == "reduce_scatter":
        t = Terms(p - 1, p - 1, 2 * share, share)
    elif collective == "allgather":
        t = Terms(p - 1, p - 1, 2 * share, 0)
    elif collective == "broadcast":
        t = Terms(p - 1, 1, middle * n, 0)
    elif collective == "reduce":
        t = Terms(p - 1, 1, middle * n, n)
    else:
        raise ValueError(f"ring does not implement {collective}")
    return [(NAME if collective in ("allreduce", "reduce_scatter", "allgather") else "chain",
             CODE, t)]


def rounds(collective, world, variant=None):
    """The schedule as rounds (algorithms.rounds), root 0; ring steps run one after
    another, the chain's hops overlap chunk by chunk."""
    p = world
    if collective in ("allreduce", "reduce_scatter", "allgather"):
        reducing = {"allreduce": p - 1, "reduce_scatter": p - 1, "allgather": 0}[collective]
        count = 2 * (p - 1) if collective == "allreduce" else p - 1
        return [ring_round(p, 1.0 / p, k < reducing, stage=k) for k in range(count)]
    if collective == "broadcast":
        return [make_round([k], [k + 1], 1.0) for k in range(p - 1)]
    if collective == "reduce":
        return [make_round([k], [k - 1], 1.0, reduces=True) for k in range(p - 1, 0, -1)]
    raise ValueError(f"ring does not implement {collective}")
