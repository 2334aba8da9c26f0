"""What each collective is: the facts the communicator, the selector, the GPU path,
`shmcoll perf` and the tests read, written once.

    >>> from shmcoll.collectives import BY_NAME
    >>> BY_NAME["reduce_scatter"].reducing, BY_NAME["gather"].rooted
    (True, True)

The size a collective is priced and reported at (nccl-tests' convention) is the bytes
of the whole vector: x for allreduce, reduce and broadcast; all world_size blocks for
reduce_scatter (x), allgather and gather (the output), scatter (the root's x) and
alltoall (x, as its output).
"""
from dataclasses import dataclass
from typing import Dict, Tuple

from shmcoll import _engine


@dataclass(frozen=True)
class Collective:
    """One collective: its engine code (shmcoll.h's sc_collective) and its kind."""
    name: str
    code: int
    reducing: bool      # combines the ranks' values with a reduction op
    rooted: bool        # takes a root rank
    blocked: bool       # its vector is world_size blocks (one per rank)
    per_rank_block: bool  # a rank passes (or gets) one block: priced at world x that

    def priced_bytes(self, nbytes: int, world: int) -> int:
        """The size this call is priced at, from the bytes of the x a rank passes (of
        the out a non-root rank of scatter receives into)."""
        return nbytes * world if self.per_rank_block else nbytes

    def bus_factor(self, world: int) -> float:
        """busbw / algbw (nccl-tests): the share of the vector that crosses the busiest
        link, so that every collective's busbw compares with the hardware's bandwidth."""
        if world == 1 or self.name in ("broadcast", "reduce", "sendrecv"):
            return 1.0
        if self.name == "allreduce":
            return 2.0 * (world - 1) / world
        return (world - 1) / world

    def result_on(self, rank: int, root: int) -> bool:
        """Whether `rank` gets a result (reduce and gather: only the root)."""
        return self.name not in ("reduce", "gather") or rank == root


def _collective(name, reducing=False, rooted=False, blocked=False, per_rank_block=False):
    return Collective(name, _engine.COLLECTIVE_CODES[name], reducing, rooted, blocked,
                      per_rank_block)


ALL: Tuple[Collective, ...] = (
    _collective("allreduce", reducing=True),
    _collective("reduce_scatter", reducing=True, blocked=True),
    _collective("allgather", blocked=True, per_rank_block=True),
    _collective("broadcast", rooted=True),
    _collective("reduce", reducing=True, rooted=True),
    _collective("gather", rooted=True, blocked=True, per_rank_block=True),
    _collective("scatter", rooted=True, blocked=True, per_rank_block=True),
    _collective("alltoall", blocked=True),
)
NAMES: Tuple[str, ...] = tuple(c.name for c in ALL)
# Point-to-point as `shmcoll perf` times it (nccl-tests' sendrecv: every rank sends to
# r+1 while receiving from r-1); no engine collective code, no algorithm to choose.
SENDRECV = Collective("sendrecv", -1, False, False, False, False)
PERF_NAMES: Tuple[str, ...] = NAMES + (SENDRECV.name,)
BY_NAME: Dict[str, Collective] = {c.name: c for c in ALL + (SENDRECV,)}
BY_CODE: Dict[int, Collective] = {c.code: c for c in ALL}
REDUCING: Tuple[str, ...] = tuple(c.name for c in ALL if c.reducing)
ROOTED: Tuple[str, ...] = tuple(c.name for c in ALL if c.rooted)
BLOCKED: Tuple[str, ...] = tuple(c.name for c in ALL if c.blocked)


def bus_factor(collective: str, world: int) -> float:
    """BY_NAME[collective].bus_factor(world)."""
    return BY_NAME[collective].bus_factor(world)


__all__ = ["Collective", "ALL", "NAMES", "SENDRECV", "PERF_NAMES", "BY_NAME", "BY_CODE", "REDUCING", "ROOTED",
           "BLOCKED", "bus_factor"]
