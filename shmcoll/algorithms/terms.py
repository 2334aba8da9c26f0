"""The terms of a cost formula, and the model that prices them.

A schedule's cost is linear in four machine parameters (Hockney's α-β, plus γ for
reduction as in Thakur, Rabenseifner & Gropp 2005, plus LogP's per-message overhead):

    time = α·steps + o·messages + β·moved + γ·reduced + setup[algorithm]

    steps     synchronisations on the critical path (each waits for a peer)
    messages  chunks this rank hands over per pipeline stage (o: the fixed cost of
              one slot handshake; P-1 messages in one step are not P-1 steps)
    moved     bytes the busiest rank copies through shared memory: every message
              is copied in by its sender and out by its receiver
    reduced   bytes the busiest rank combines
    setup     a fixed cost per call of each algorithm (its bookkeeping)

Because the time is linear in all parameters, calibration is a least-squares fit of
measured times against these terms (shmcoll.calibrate).
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
    setup: ((algorithm, seconds per call), ...)."""
    alpha: float = 1e-6
    overhead: float = 0.2e-6
    beta: float = 1.0 / 2.5e9
    gamma: float = 1.0 / 5e9
    setup: tuple = ()

    def seconds(self, terms, algorithm=None):
        fixed = dict(self.setup).get(algorithm, 0.0) if self.setup else 0.0
        return (self.alpha * terms.steps + self.overhead * terms.messages +
                self.beta * terms.moved + self.gamma * terms.reduced + fixed)

    def as_dict(self):
        return {"alpha": self.alpha, "overhead": self.overhead, "beta": self.beta,
                "gamma": self.gamma, "setup": dict(self.setup)}


def log2_ceil(p):
    """⌈log2 p⌉: the depth of a binomial tree over p ranks."""
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def pow2_floor(p):
    return 1 << (p.bit_length() - 1)
