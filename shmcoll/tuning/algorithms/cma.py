"""Single copy for ordinary arrays: peers read a rank's x (or a rank writes its part
into their out) where it lies in the other process, with cross-memory attach
(process_vm_readv, process_vm_writev), instead of having it copied into channel slots
first.  Offered only when every rank may reach every other (the probe at creation,
csrc/sc_cma.c; SHMCOLL_CMA).

The schedules are the symmetric ones (symmetric.py, csrc/sc_single_copy.c): one-shot
and two-shot AllReduce, ReduceScatter, AllGather, Gather, Broadcast, Reduce — with the
peers' arrays reached by address (each rank publishes them in its call record), and
a reduction reading each peer's chunk into a staging buffer first.  One-shot in place
makes its result aside and copies it into x after the closing barrier.  The copies
of AllGather and Gather go the other way (process_vm_writev): each rank pushes its
own x into the others' out, so Gather's root no longer copies every row itself (its
critical path is one row, n/P, where the symmetric schedule's is n(P-1)/P); two-shot
AllReduce's ranks push their reduced blocks (chunk by chunk as they make them, with no
middle barrier), and Broadcast's root pushes the first 1/P of every receiver's copy
while the receivers pull the rest (symmetric.py).  Reduce is
shared the same way: every rank reduces one block of every x and writes it into the
root's out (each moves n: (P-1)/P read, 1/P written; reduces n(P-1)/P), where over
symmetric arrays the root reduces it all.  The cost
is the symmetric schedule's with every byte read from a peer priced as ρ times what
it costs through a channel (copied in by the peer and out by the reader: 2β), every
byte written into a peer as ω times it, plus a fixed cost per system call:

    symmetric terms with moved·2ρ·s (read) or moved·2ω (written), + σ·calls

priced by the collective's own fit — the one that prices the channel schedules cma
competes with, so no difference between two fits can make it look cheap (the AllGather
fit's β is not the AllReduce fit's); Reduce's fit prices a byte as its direct root
pays it, alone, and cma's Reduce adds what every rank working at once costs
(_shared_reduce).  ρ (a cross-memory read of bytes a peer has just written, over the
same bytes' two copies through a channel), ω (a write of bytes in the writer's cache,
as a pushed row or reduced block is, over the same) and σ (a small read, scaled by
Models.ranks_per_cpu) are measured by rank 0 — with rank 1 — at creation and are the
same on every rank (Models.cross_memory; three creations on a 2-core Xeon measured ω
0.25-0.43 beside ρ 0.63-1.04).  s counts the ranks that read the same pages at once,
which contend for them (the kernel pins every page it copies): P-1 for Broadcast's
receivers and one-shot AllReduce, 1 where each page is read or written by one rank (a
block by the rank reducing it, a row or reduced block pushed into a peer).  At 4
ranks on 2 cores cma Gather took 0.44-0.63x the time of the binomial tree from 512 KiB
and AllGather 0.8-0.95x direct's, where counting every rank as a concurrent reader had
priced both out.  Where ρ ≥ 1 (on some machines the kernel's page pinning makes a read slower
than two copies) the cost model never picks cma for reads; where it is well below 1,
single copy wins from mid sizes.

What a read costs depends on something no model of the call can see: whether the
peer's bytes changed since this rank last read them.  Bytes a peer has just written
come from its cache (ρ above); bytes this rank read before and the peer left alone —
an x that is the same from call to call, as in a benchmark's loop or a broadcast of
weights that did not change — are still in the reader's cache, and the kernel copies
them at cache speed (the probe measures that ratio too: 0.27-0.51 where ρ is 0.44-1.1
on a 2-core Xeon, and there cma Broadcast of 128 KiB-2 MiB at P=2 took 0.44-0.59x the
chain's time with an unchanged x, and 0.65-0.98x with x rewritten before every call:
README, cross-memory attach).  So
price() is the price for fresh bytes (never below the symmetric schedule's, which loads
the same bytes without a system call), what the model chooses by, and least_price() the
price for unchanged ones: where that is close to the cheapest schedule, cma joins the
trial of the call's size (tuning.trials), which measures the calls as the program
makes them.
"""
from dataclasses import dataclass

from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms import symmetric
from shmcoll.tuning.algorithms.terms import Terms, model_for_collective

NAME = "cma"
CODE = SCHEDULE_CODES["cma"]
CODE_TWO_SHOT = SCHEDULE_CODES["cma_two_shot"]
DESCRIPTION = "single copy of ordinary arrays: peers' buffers read with cross-memory attach"
COLLECTIVES = symmetric.COLLECTIVES

CHUNK = 256 << 10       # a reduction reads a peer's buffer one slot's worth at a time


@dataclass(frozen=True)
class ReadTerms(Terms):
    """Terms of a single-copy schedule, plus the system calls (reads, writes) it makes,
    the bytes of `moved` it writes into peers (the rest it reads from them), and how
    many ranks' calls read the same pages at once (`sharers`)."""
    reads: float = 0.0
    written: float = 0.0
    sharers: int = 1


DEFAULT_COSTS = (0.0, 0.5, 0.5, 0.5)    # (σ, ρ, ρ unchanged, ω) where none were measured


def price(models, collective, terms, variant, unchanged=False):
    """Seconds of one variant (see the module's text) reading bytes a peer has just
    written (`unchanged`: bytes read before and left as they were); priced as
    symmetric's when `models` carries no measured cross-memory costs."""
    per_read, fresh, same, write = getattr(models, "cross_memory", ()) or DEFAULT_COSTS
    crowding = getattr(models, "ranks_per_cpu", 1.0)
    per_read *= crowding        # a read's fixed cost is its reader's CPU time
    ratio = (same if unchanged else fresh) * terms.sharers
    copies = (terms.moved - terms.written) * 2 * ratio + terms.written * 2 * write
    if collective == "reduce":
        seconds = _shared_reduce(models, terms, variant, copies, crowding)
    else:
        read = Terms(terms.steps, terms.messages, copies, terms.reduced)
        seconds = symmetric.price(models, collective, read, variant, fit=None)
    seconds += per_read * terms.reads
    if unchanged:
        return seconds
    # A kernel read of fresh bytes costs at least a load of them where they lie: never
    # less than the same schedule over symmetric buffers (on a symmetric x both are
    # offered, and a low ρ must not put the syscall ahead of the pointer).
    return max(seconds, symmetric.price(models, collective, terms, variant) +
               per_read * terms.reads)


def _shared_reduce(models, terms, variant, copies, crowding):
    """cma Reduce by the Reduce fit.  That fit is made on schedules whose direct one
    reduces on the root alone, reading each peer's slot as it combines it: it may fold
    direct's copies into γ (β 0, as the reference's 4-rank fit does) and prices a byte
    as one rank working alone pays it.  cma's kernel copy is a pass of its own, priced
    by the fit's shared β where direct's is lower, and every rank reads and reduces its
    block at once, so where ranks outnumber CPUs that work takes `crowding` times as
    long (4 ranks on 2 cores, 16 KiB-64 MiB: it took 0.66-1.1x this price; priced as
    one rank alone, 2.3-2.9x its price from 512 KiB)."""
    model = model_for_collective(models, "reduce")
    beta = max(model.beta_of(symmetric.PRICED_AS), model.beta)
    fixed = symmetric.price(model, "reduce", Terms(terms.steps, terms.messages), variant)
    return fixed + crowding * (copies * beta + terms.reduced * model.gamma)


def least_price(models, collective, terms, variant):
    """The least a variant may cost: its price where every byte it reads is unchanged
    since this rank last read it."""
    return price(models, collective, terms, variant, unchanged=True)


def _sharers(collective, variant, world):
    """Ranks whose system calls copy the same pages at once: every receiver of a
    Broadcast pulls the root's x, every rank of a one-shot AllReduce reads all of every
    peer's; elsewhere each page is read or written by one rank (a block by the rank
    that reduces it, a row or a reduced block pushed into a peer's out)."""
    if collective == "broadcast" or (collective == "allreduce" and variant == "one-shot"):
        return max(1, world - 1)
    return 1


def variants(collective, world, nbytes):
    """The symmetric schedules' variants under this algorithm's codes, with their
    system calls on the busiest rank: a reduction reads each peer's part chunk by
    chunk; a copy moves each part in one call (Broadcast's root pushes to every
    receiver; a Gather's rank pushes its one row); and the bytes the busiest rank
    writes into peers (AllGather's and Gather's rows, two-shot's reduced block,
    Reduce's block), priced by ω where the bytes it reads are priced by ρ.  Two-shot
    pushes each reduced chunk as it makes it, so it has no middle barrier: a
    synchronisation (and its P-1 flags) fewer than over symmetric buffers."""
    codes = {symmetric.CODE: CODE, symmetric.CODE_TWO_SHOT: CODE_TWO_SHOT}
    block = float(nbytes) / world
    found = []
    for variant, code, t in symmetric.variants(collective, world, nbytes):
        reads = world - 1
        written = 0.0
        if collective == "allgather":   # every row pushed
            written = t.moved
        elif collective == "gather":
            t, reads = Terms(t.steps, t.messages, block, 0), 1
            written = t.moved
        elif variant == "two-shot":     # per chunk of its block: P-1 reads, P-1 pushes
            t = Terms(t.steps - 1, t.messages - (world - 1), t.moved, t.reduced)
            written = t.moved / 2
            reads = 2 * (world - 1) * max(1.0, block / CHUNK)
        elif collective == "reduce":    # per chunk of its block: P-1 reads, 1 write
            t = Terms(t.steps, t.messages, float(nbytes), t.reduced / world)
            written = block
            reads = world * max(1.0, block / CHUNK)
        elif t.reduced:
            reads += t.moved / CHUNK
        found.append((NAME if variant == symmetric.NAME else variant, codes[code],
                      ReadTerms(t.steps, t.messages, t.moved, t.reduced, reads, written,
                                _sharers(collective, variant, world))))
    return found
