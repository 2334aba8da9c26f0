"""Single copy for ordinary arrays: peers read a rank's x (and, two-shot, its out)
where it lies in that rank's process, with cross-memory attach (process_vm_readv),
instead of having it copied into channel slots first.  Offered only when every rank
may read every other (the probe at creation, csrc/sc_cma.c; SHMCOLL_CMA).

The schedules are the symmetric ones (symmetric.py, csrc/sc_single_copy.c): one-shot
and two-shot AllReduce, ReduceScatter, AllGather, Gather, Broadcast, Reduce — with the
peers' arrays reached by address (each rank publishes them in its call record), and
a reduction reading each peer's chunk into a staging buffer first.  One-shot in place
makes its result aside and copies it into x after the closing barrier.  The cost is
the symmetric schedule's with every byte read from a peer priced as ρ times what it
costs through a channel (copied in by the peer and out by the reader: 2β), plus a
fixed cost per read:

    symmetric terms with moved·2ρ, + σ·reads

priced by the collective's own fit — the one that prices the channel schedules cma
competes with, so no difference between two fits can make it look cheap (the AllGather
fit's β is not the AllReduce fit's).  ρ (a cross-memory read of bytes a peer has just
written, over the same bytes' two copies through a channel) and σ (a small read) are
measured by rank 0 — with rank 1 — at creation and are the same on every rank
(Models.cross_memory).  Where ρ ≥ 1 (on some machines the kernel's page pinning
makes a read slower than two copies) the cost model never picks cma; where it is well
below 1, single copy wins from mid sizes.
"""
from dataclasses import dataclass

from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms import symmetric
from shmcoll.tuning.algorithms.terms import Terms

NAME = "cma"
CODE = SCHEDULE_CODES["cma"]
CODE_TWO_SHOT = SCHEDULE_CODES["cma_two_shot"]
DESCRIPTION = "single copy of ordinary arrays: peers' buffers read with cross-memory attach"
COLLECTIVES = symmetric.COLLECTIVES

CHUNK = 256 << 10       # a reduction reads a peer's buffer one slot's worth at a time


@dataclass(frozen=True)
class ReadTerms(Terms):
    """Terms of a single-copy schedule, plus the process_vm_readv calls it makes."""
    reads: float = 0.0


def price(models, collective, terms, variant):
    """Seconds of one variant (see the module's text); priced as symmetric's when
    `models` carries no measured cross-memory costs."""
    per_read, ratio = getattr(models, "cross_memory", ()) or (0.0, 0.5)
    read = Terms(terms.steps, terms.messages, terms.moved * 2 * ratio, terms.reduced)
    return symmetric.price(models, collective, read, variant, fit=None) + per_read * terms.reads


def variants(collective, world, nbytes):
    """The symmetric schedules' variants under this algorithm's codes, with their reads:
    a reduction reads each peer's part chunk by chunk, a copy each part in one read."""
    codes = {symmetric.CODE: CODE, symmetric.CODE_TWO_SHOT: CODE_TWO_SHOT}
    found = []
    for variant, code, t in symmetric.variants(collective, world, nbytes):
        sources = 1 if collective == "broadcast" else world - 1
        reads = sources * (2 if variant == "two-shot" else 1)
        if t.reduced:
            reads += t.moved / CHUNK
        found.append((NAME if variant == symmetric.NAME else variant, codes[code],
                      ReadTerms(t.steps, t.messages, t.moved, t.reduced, reads)))
    return found
