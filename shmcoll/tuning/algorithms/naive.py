"""The seed's baseline AllReduce: Reduce everything to rank 0, then Broadcast it.

Rank 0 receives and reduces P-1 vectors, then sends the result P-1 times (a star,
overlapped chunk by chunk).  Kept as the reference the other schedules beat.
C: csrc/sc_rooted.c (star shape).

    allreduce   2α + 2(P-1)·o + 2n(P-1)·β + n(P-1)·γ
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import star_round
from shmcoll.tuning.algorithms.terms import Terms

NAME = "naive"
CODE = SCHEDULE_CODES["naive"]
DESCRIPTION = "reduce to rank 0, then broadcast (the baseline)"
COLLECTIVES = ("allreduce",)


def variants(collective, world, nbytes):
    if collective != "allreduce":
        raise ValueError(f"naive does not implement {collective}")
    p, n = world, float(nbytes)
    return [(NAME, CODE, Terms(2, 2 * (p - 1), 2 * n * (p - 1), n * (p - 1)))]


def rounds(collective, world, variant=None):
    """Reduce into rank 0 and broadcast from it, overlapped chunk by chunk."""
    if collective != "allreduce":
        raise ValueError(f"naive does not implement {collective}")
    return [star_round(world, 1.0, inward=True, reduces=True),
            star_round(world, 1.0, inward=False)]
