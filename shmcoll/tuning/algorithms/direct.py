"""Direct schedules: every rank exchanges with every peer in a single step — the
shared-memory-native way (one synchronisation instead of a chain of them).

  one-shot AllReduce   every rank sends x to every peer and reduces all P vectors
                       itself in rank order (latency-optimal, n·(P-1) bytes each)
  two-shot AllReduce   direct ReduceScatter (block q to rank q, reduced in rank
                       order) then direct AllGather, interleaved chunk by chunk
  ReduceScatter, AllGather   the two halves on their own
  AllToAll             block q to rank q, every pair at once (staggered: r+1, r+2, …)
  Broadcast, Reduce, Gather, Scatter   a star around the root
What goes to every peer (one-shot's vector, AllGather's block, two-shot's reduced
block, Broadcast's chunk) is written once and read by each peer where it lies
(fan-out, sc_put_all).  Inline and eager (every collective but alltoallv): where every
rank's part is at most INLINE_BYTES, it rides in the call record each rank publishes and
every peer checks anyway; where it is at most EAGER_BYTES, in a part buffer beside the
record, written before the record and read where it lies (csrc/sc_inline.c).  Either way
the call is that one exchange of records plus the copies: no channel, no message.  Both
are priced in the selector's cost table, at the least synchronisation any other schedule
of the call pays plus their copies and reduction (tuning.selector.cost_table).
C: csrc/sc_direct.c, csrc/sc_alltoall.c, csrc/sc_rooted.c (star), csrc/sc_inline.c.  n as in
shmcoll.collectives:

    allreduce one-shot   α +  (P-1)·o +        nP·β +  n(P-1)·γ
    allreduce two-shot  2α + 2(P-1)·o + n(3P-2)/P·β + n(P-1)/P·γ
    reduce_scatter       α +  (P-1)·o + 2n(P-1)/P·β + n(P-1)/P·γ
    allgather            α +  (P-1)·o +         n·β
    alltoall             α +  (P-1)·o + 2n(P-1)/P·β
    broadcast            α +  (P-1)·o +         n·β
    reduce               α +  (P-1)·o +   n(P-1)·β +  n(P-1)·γ
    gather, scatter      α +  (P-1)·o +  n(P-1)/P·β
(β per byte copied by the busiest rank: what it sends plus what it receives; at
P = 2 fan-out changes nothing.)
"""
from shmcoll._engine import EAGER_BYTES, INLINE_BYTES, SCHEDULE_CODES
from shmcoll.tuning.algorithms.rounds import all_pairs_round, star_round
from shmcoll.tuning.algorithms.terms import Terms

NAME = "direct"
CODE = SCHEDULE_CODES["direct"]
CODE_TWO_SHOT = SCHEDULE_CODES["direct_two_shot"]
CODE_INLINE = SCHEDULE_CODES["direct_inline"]
CODE_EAGER = SCHEDULE_CODES["direct_eager"]
INLINE, EAGER = "inline", "eager"
WITH_THE_RECORDS = (INLINE, EAGER)   # the variants whose parts go with the call records
INLINE_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                      "gather", "scatter", "alltoall")
DESCRIPTION = "one step, every peer at once: one-shot/two-shot AllReduce, star rooted ops"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather",
               "scatter", "alltoall")


def variants(collective, world, nbytes):
    p, n = world, float(nbytes)
    share = n * (p - 1) / p
    if collective == "allreduce":
        one_shot = Terms(1, p - 1, n * p, n * (p - 1))
        return [("one-shot", CODE, one_shot),
                ("two-shot", CODE_TWO_SHOT, Terms(2, 2 * (p - 1), n * (3 * p - 2) / p, share))
                ] + _with_the_records(collective, world, nbytes, one_shot)
    terms = {
        "reduce_scatter": Terms(1, p - 1, 2 * share, share),
        "allgather": Terms(1, p - 1, n, 0),
        "alltoall": Terms(1, p - 1, 2 * share, 0),
        "broadcast": Terms(1, p - 1, n, 0),
        "reduce": Terms(1, p - 1, n * (p - 1), n * (p - 1)),
        "gather": Terms(1, p - 1, share, 0),
        "scatter": Terms(1, p - 1, share, 0),
    }
    if collective not in terms:
        raise ValueError(f"direct does not implement {collective}")
    star = collective in ("broadcast", "reduce", "gather", "scatter")
    return [("star" if star else NAME, CODE, terms[collective])] + \
        _with_the_records(collective, world, nbytes, terms[collective])


def part_bytes(collective, world, nbytes):
    """The bytes of x a rank publishes in an inline or eager call priced at `nbytes`
    (None: the collective has neither schedule)."""
    if collective not in INLINE_COLLECTIVES:
        return None
    return nbytes // world if collective in ("allgather", "gather") else nbytes


def _with_the_records(collective, world, nbytes, channel):
    """The inline or eager variant where every rank's part fits: one step (the
    exchange of records every call makes) and no message; the copies and reduction of
    the channel schedule `channel` (a Terms), except inline's, whose parts are copied
    with the records.  The cost table prices both from the other schedules of the call
    (tuning.selector.cost_table)."""
    part = part_bytes(collective, world, nbytes)
    if part is None or part > EAGER_BYTES:
        return []
    if part <= INLINE_BYTES:
        return [(INLINE, CODE_INLINE, Terms(1, 0, part * world, channel.reduced))]
    return [(EAGER, CODE_EAGER, Terms(1, 0, channel.moved, channel.reduced))]


def rounds(collective, world, variant=None):
    """The schedule as rounds (algorithms.rounds), root 0; the two shots of two-shot
    interleave chunk by chunk, so they share a stage."""
    p = world
    if collective == "allreduce":
        if variant == "two-shot":
            return [all_pairs_round(p, 1.0 / p, True),
                    all_pairs_round(p, 1.0 / p, False, fanned=True)]
        return [all_pairs_round(p, 1.0, True, fanned=True)]
    if collective in ("reduce_scatter", "allgather", "alltoall"):
        return [all_pairs_round(p, 1.0 / p, collective == "reduce_scatter",
                                fanned=collective == "allgather")]
    star = {"broadcast": (1.0, False, False), "reduce": (1.0, True, True),
            "gather": (1.0 / p, True, False), "scatter": (1.0 / p, False, False)}
    if collective not in star:
        raise ValueError(f"direct does not implement {collective}")
    share, inward, reduces = star[collective]
    return [star_round(p, share, inward, reduces, fanned=collective == "broadcast")]
