"""Single-copy schedules over symmetric buffers (Communicator.empty): peers' arrays
are read where they lie, so nothing is staged through channel slots.  They run only
when x is in a symmetric allocation (every rank's, at the same place), and then
compete with every other schedule in the same cost table.

  one-shot AllReduce   every rank reduces all P arrays itself, in rank order
  two-shot AllReduce   rank q reduces block q into its (symmetric) out, then every
                       rank copies the other blocks from the ranks that reduced them
  ReduceScatter        rank q reduces block q of every array
  AllGather, Gather    copies of every array (on the root only for Gather)
  Broadcast            every rank copies the root's array, the root pushing the first
                       1/P of every copy while the receivers pull the rest
  Reduce               the root reduces every array
Every schedule starts by checking its peers' calls (they publish theirs after writing
x) and ends with a barrier after the last read (a rank may write its array again once
the call returned).  C: csrc/sc_single_copy.c.  n as in shmcoll.collectives; each is its
channel counterpart (direct.py) without the senders' copies into the slots, so β counts
one copy of each byte a peer contributes where a channel counts two:

    allreduce one-shot   2α + 2(P-1)·o +   n(P-1)·β +   n(P-1)·γ
    allreduce two-shot   3α + 3(P-1)·o + 2n(P-1)/P·β + n(P-1)/P·γ
    reduce_scatter       2α + 2(P-1)·o +  n(P-1)/P·β + n(P-1)/P·γ
    allgather, gather    2α + 2(P-1)·o +  n(P-1)/P·β
    broadcast            2α + 2(P-1)·o +  n(P-1)/P·β
    reduce               2α + 2(P-1)·o +   n(P-1)·β +   n(P-1)·γ
(o: a peer's flag read at each synchronisation, as a channel's slot handshake.)

No calibration measures them: price() takes direct's parameters from the AllReduce fit
— the one fit where copying (β) and combining (γ) can be told apart, since there the
algorithms copy different multiples of what they reduce; in the other reducing
collectives every algorithm copies twice what it reduces, so a fit may put all copying
into γ — and counts direct's fixed cost per call (what a call's synchronisation costs
where ranks outnumber cores) once per synchronisation.
"""
from shmcoll._engine import SCHEDULE_CODES
from shmcoll.tuning.algorithms.terms import Terms, model_for_collective

NAME = "symmetric"
CODE = SCHEDULE_CODES["symmetric"]
CODE_TWO_SHOT = SCHEDULE_CODES["symmetric_two_shot"]
DESCRIPTION = "single copy: peers' symmetric buffers (Communicator.empty) read in place"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather")


PRICED_AS = "direct"


def price(models, collective, terms, variant, fit="allreduce"):
    """Seconds of one variant of `collective` (see the module's text): `models` is a
    Models or a CostModel, whose `fit` (the AllReduce one) prices every collective
    here.  Each step is a synchronisation: direct's fixed cost counts once per step."""
    model = model_for_collective(models, fit or collective)
    fixed = dict(model.setup).get(PRICED_AS, 0.0) if model.setup else 0.0
    return model.seconds(terms, PRICED_AS) + max(0, terms.steps - 1) * fixed


def variants(collective, world, nbytes):
    p, n = world, float(nbytes)
    share = n * (p - 1) / p
    flags = 2 * (p - 1)         # each synchronisation reads a flag of every peer
    if collective == "allreduce":
        return [("one-shot", CODE, Terms(2, flags, n * (p - 1), n * (p - 1))),
                ("two-shot", CODE_TWO_SHOT, Terms(3, 3 * (p - 1), 2 * share, share))]
    terms = {
        "reduce_scatter": Terms(2, flags, share, share),
        "allgather": Terms(2, flags, share, 0),
        "gather": Terms(2, flags, share, 0),
        "broadcast": Terms(2, flags, share, 0),
        "reduce": Terms(2, flags, n * (p - 1), n * (p - 1)),
    }
    if collective not in terms:
        raise ValueError(f"symmetric does not implement {collective}")
    return [(NAME, CODE, terms[collective])]
