"""Trials: the cost model's close calls settled by measurement, on first use.

The model's parameters come from a calibration (of this machine, or of the reference
machine when this one has none), and where it prices two schedules within a few
percent of each other its choice is a coin toss: on a machine it has never seen,
`auto` was 1.13-1.35x slower than the best fixed algorithm at some sizes.  So where
the model prices other schedules within MARGIN of its cheapest, the first blocking
calls of that size class (a power of two of bytes) run each of them in turn, in runs
of BLOCK consecutive calls, PASSES times over — the first call of a run untimed (it
carries the previous schedule's imbalance between the ranks, and a channel's memory is
backed at its first use), the others timed as the calls of a loop are — and the ranks
agree on the winner: each candidate's median call on every rank, maximised over the
ranks by one small AllReduce, the fastest wins (a median, not the best: the best of a
few calls favours the schedule whose times scatter most) — unless the model's own
choice is within CHALLENGE of it: a trial's calls alternate schedules every few calls
and run cold, which brings their times closer together than they are in a loop, so a
few percent there are noise more often than not.  Every rank
makes the same calls in the same order, so every rank runs the same candidate in
every call and reaches the same winner.  The winner then serves every size of the
class, as the model's choice would have.

A trial also settles what the model cannot know: cma's reads cost a fraction of two
channel copies where the peer's bytes did not change since the last read, and more than
them where the peer has just written them (algorithms.cma).  It is priced for fresh
bytes, and tried where its price for unchanged ones is within UNSURE_MARGIN of the
cheapest (wider than MARGIN: the model's fixed cost of a cma call is the less certain
part of its price): the program's own calls tell which kind it makes.

Trials run where every rank has a usable CPU of its own (Communicator: where ranks
outnumber the CPUs a call's time follows the scheduler more than the schedule).
Trials count blocking calls only (a nonblocking call's time is not the caller's to
see); nonblocking calls meanwhile run what the model chose.  Named algorithms
(algo=, SHMCOLL_ALGO) are never tried against, nor is direct's inline schedule where
the model picks it: it does a part of what every other schedule does
(algorithms.direct), so a trial could only take noise for a difference.  Calls of one size class may round
differently while the trial runs (each schedule combines in its own order) and from
run to run (the winner follows the machine); SHMCOLL_TUNE=off keeps the model's
choice alone, a pure function of the call.
"""
import statistics
from dataclasses import dataclass, field
from typing import List

MARGIN = 1.5        # schedules priced within this factor of the cheapest are tried
MAX_CANDIDATES = 3  # the cheapest three at most
# A price with a known blind spot (Candidate.least) is tried from further away: cma's
# two synchronisations are priced with a channel fit's α, 1-1.5 µs over what they
# measure at 32 KiB on a 2-core Xeon, where its least price was 1.7-1.8x the cheapest
# and the read took 0.7x the channel schedules' time.
UNSURE_MARGIN = 2.0
# The model's choice stays unless another candidate measured this much faster: on the
# 2-core EPYC, P=2, trials of 4 KiB calls put candidates within 5-10% of each other
# where in a loop eager AllReduce took 0.7 µs and the ring 1.1 (auto picked the ring,
# 1.24x the best, and the chain for 4 KiB Broadcast, 1.12x).
CHALLENGE = 0.10
BLOCK = 4           # consecutive calls of one candidate: one untimed, then timed
PASSES = 3          # runs of each candidate (so a slow stretch hits more than one)


@dataclass
class Trial:
    """One size class's trial: the candidates (algorithm names, cheapest modelled
    first), the model's choice among them (favourite: '' for none), the calls made so
    far and each candidate's timed seconds."""
    candidates: List[str]
    favourite: str = ""
    calls: int = 0
    seconds: List[List[float]] = field(default_factory=list)
    winner: str = ""

    def __post_init__(self):
        self.seconds = [[] for _ in self.candidates]

    @property
    def current(self) -> str:
        """The candidate the next call runs (runs of BLOCK, in turn)."""
        return self.candidates[(self.calls // BLOCK) % len(self.candidates)]

    @property
    def measured(self) -> bool:
        return self.calls >= len(self.candidates) * BLOCK * PASSES

    @property
    def calls_left(self) -> int:
        """Blocking calls before the winner serves the class: the candidates' runs
        still to make, and the call that settles (its agreement adds a small AllReduce)."""
        if self.winner:
            return 0
        return len(self.candidates) * BLOCK * PASSES - self.calls + 1

    def observe(self, seconds: float) -> None:
        """The call of `current` took `seconds` on this rank (a run's first is not timed)."""
        if self.calls % BLOCK:
            self.seconds[(self.calls // BLOCK) % len(self.candidates)].append(seconds)
        self.calls += 1

    def medians(self) -> List[float]:
        return [statistics.median(s) for s in self.seconds]

    def settle(self, agreed: List[float]) -> str:
        """The winner by `agreed` (every candidate's median, the slowest rank's): the
        fastest, or the favourite where it is within CHALLENGE of the fastest."""
        fastest = min(range(len(agreed)), key=agreed.__getitem__)
        self.winner = self.candidates[fastest]
        if self.favourite in self.candidates:
            mine = agreed[self.candidates.index(self.favourite)]
            if mine <= agreed[fastest] * (1 + CHALLENGE):
                self.winner = self.favourite
        return self.winner


def size_class(nbytes: int) -> int:
    """Sizes that share one trial: [2^(k-1), 2^k) bytes."""
    return int(nbytes).bit_length()


def candidates(table, chosen):
    """The algorithms worth a trial: the model's choice and the MAX_CANDIDATES - 1
    others priced closest to it, within MARGIN; and besides them any whose price the
    model cannot pin down (Candidate.least: cma, reading bytes that may or may not have
    changed since its last read) where the least it may cost is within UNSURE_MARGIN.
    Cheapest first; fewer than two: none."""
    cheapest = min(c.seconds for c in table.values())
    ranked = sorted(table.values(), key=lambda c: c.seconds)
    close = [c.algorithm for c in ranked if c.seconds <= MARGIN * cheapest]
    if chosen not in close:
        return []
    close = close[:MAX_CANDIDATES]
    unsure = [c for c in ranked if c.least is not None and c.algorithm not in close
              and c.least <= UNSURE_MARGIN * cheapest]
    close += [c.algorithm for c in unsure]
    return close if len(close) > 1 else []


def describe(collective, nbytes, world, trial, agreed):
    """One line for SHMCOLL_DEBUG=INFO: what was tried and what won."""
    times = ", ".join(f"{a} {s * 1e6:.2f}" for a, s in zip(trial.candidates, agreed))
    return (f"{collective} {nbytes} B P={world}: trial (median of {(BLOCK - 1) * PASSES}, "
            f"slowest rank, us) "
            f"{times} -> {trial.winner}")
