"""The terms of a cost formula, and the model that prices them.

A schedule's cost is linear in four machine parameters (Hockney's α-β, plus γ for
reduction as in Thakur, Rabenseifner & Gropp 2005, plus LogP's per-message overhead):

    time = α·steps + o·messages + β[algorithm]·moved + γ·reduced + setup[algorithm]

    steps     synchronisations on the critical path (each waits for a peer)
    messages  chunks this rank hands over per pipeline stage (o: the fixed cost of
              one slot handshake; P-1 messages in one step are not P-1 steps)
    moved     bytes the busiest rank copies through shared memory: every message
              is copied in by its sender and out by its receiver
    reduced   bytes the busiest rank combines
    setup     a fixed cost per call of each algorithm (its bookkeeping)
    β[alg]    β may be calibrated per algorithm: a schedule that walks the whole vector
              once per step (recursive halving) pays main-memory bandwidth where a
              chunk-major one (ring) keeps each chunk in cache between its steps

Because the time is linear in all parameters, calibration is a least-squares fit of
measured times against these terms (shmcoll.tools.calibrate).
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Terms:
    steps: float = 0.0
    messages: float = 0.0
    moved: float = 0.0
    reduced: float = 0.0

    def __add__(self, other):
        return Terms(self.steps + other.steps, self.messages + other.messages,
                     self.moved + other.moved, self.reduced + other.reduced)

    def as_row(self):
        return (self.steps, self.messages, self.moved, self.reduced)


@dataclass(frozen=True)
class CostModel:
    """α: seconds per step, o: per message, β: per byte moved, γ: per byte reduced,
    setup: ((algorithm, seconds per call), ...), bandwidth: ((algorithm, β), ...)
    for algorithms whose β differs from the shared one."""
    alpha: float = 1e-6
    overhead: float = 0.2e-6
    beta: float = 1.0 / 2.5e9
    gamma: float = 1.0 / 5e9
    setup: tuple = ()
    bandwidth: tuple = ()

    def beta_of(self, algorithm):
        return dict(self.bandwidth).get(algorithm, self.beta) if self.bandwidth else self.beta

    def seconds(self, terms, algorithm=None):
        fixed = dict(self.setup).get(algorithm, 0.0) if self.setup else 0.0
        return (self.alpha * terms.steps + self.overhead * terms.messages +
                self.beta_of(algorithm) * terms.moved + self.gamma * terms.reduced + fixed)

    def as_dict(self):
        return {"alpha": self.alpha, "overhead": self.overhead, "beta": self.beta,
                "gamma": self.gamma, "setup": dict(self.setup), "bandwidth": dict(self.bandwidth)}


@dataclass(frozen=True)
class Models:
    """One CostModel per collective: each collective's schedules are calibrated on
    their own measurements (the busiest rank of a star and of a ring use memory
    differently), with `default` for collectives not calibrated.  `cross_memory`:
    (seconds of a small read, ρ, ρ for bytes unchanged since they were last read, ω)
    of cross-memory attach as the communicator measured them (algorithms.cma), empty
    where it cannot be used.  `ranks_per_cpu`: the job's ranks over its usable CPUs
    where they outnumber them, else 1 — how much longer work that every rank does at
    once takes than one rank alone on a core (the fits price it for the schedules they
    were measured on; cma's system calls and its Reduce need it on top)."""
    default: CostModel = CostModel()
    by_collective: tuple = ()      # ((collective, CostModel), ...)
    cross_memory: tuple = ()
    ranks_per_cpu: float = 1.0

    def for_collective(self, collective):
        return dict(self.by_collective).get(collective, self.default)


def model_for_collective(model, collective):
    """The CostModel pricing `collective`, from a CostModel or a Models."""
    return model.for_collective(collective) if isinstance(model, Models) else model


def log2_ceil(p):
    """⌈log2 p⌉: the depth of a binomial tree over p ranks."""
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def pow2_floor(p):
    return 1 << (p.bit_length() - 1)
