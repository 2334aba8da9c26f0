"""Bruck's all-to-all (Bruck, Ho, Kipnis, Upfal & Weathersby 1997): ⌈log2 P⌉ steps
instead of direct's P-1 exchanges, for small blocks.

Blocks are rotated so that local block i is bound for rank r+i; at step k every
block whose index has bit k set moves, packed into one message, to rank r+2^k (and as
many arrive from r-2^k).  A step carries the m_k blocks of [0, P) with bit k set,
about half the vector, so Bruck trades direct's P-1 handshakes for log2 P steps that
move n/2 each: it wins while blocks are small and ranks many.  C: csrc/sc_alltoall.c.

    alltoall   k·α + k·o + Σ_k 2·n·m_k/P·β      (k = ⌈log2 P⌉, m_k = #{i < P : i & 2^k})
(β per byte copied through shared memory; the rotations and the packing are local
copies of the same order, not counted.)
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import make_round
from shmcoll.tuning.algorithms.terms import Terms

NAME = "bruck"
CODE = SCHEDULE_CODES["bruck"]
DESCRIPTION = "log-step all-to-all for small blocks"
COLLECTIVES = ("alltoall",)


def _moving(world):
    """(2^k, blocks moved at step k) for every step."""
    bit, out = 1, []
    while bit < world:
        out.append((bit, sum(1 for i in range(world) if i & bit)))
        bit <<= 1
    return out


def variants(collective, world, nbytes):
    if collective != "alltoall":
        raise ValueError(f"bruck does not implement {collective}")
    n, steps = float(nbytes), _moving(world)
    moved = sum(2 * n * m / world for _, m in steps)
    return [(NAME, CODE, Terms(len(steps), len(steps), moved, 0))]


def rounds(collective, world, variant=None):
    """Step k: every rank sends m_k blocks to rank r + 2^k; each step waits for the last."""
    if collective != "alltoall":
        raise ValueError(f"bruck does not implement {collective}")
    src = list(range(world))
    return [make_round(src, [(r + bit) % world for r in src], m / world, stage=i)
            for i, (bit, m) in enumerate(_moving(world))]
