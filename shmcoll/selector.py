"""Algorithm selection: a cost table over the registered algorithms, argmin, override.

Every rank evaluates the same pure function of (collective, bytes, world size), so
every rank reaches the same decision without exchanging a message.
"""
from dataclasses import dataclass

from shmcoll.algorithms import REGISTRY


@dataclass(frozen=True)
class CostModel:
    """α: seconds per message, β: seconds per byte moved, γ: seconds per byte reduced.

    The defaults put the direct/ring crossover near 2 KiB at P = 2 and 4, where
    `shmcoll perf --algo ring|direct` sweeps put it on a 2-core VM.
    """
    alpha: float = 1e-6
    beta: float = 1.0 / 2.5e9
    gamma: float = 1.0 / 5e9


DEFAULT_MODEL = CostModel()


def cost_table(collective, world, nbytes, model=DEFAULT_MODEL):
    """{algorithm name: modelled seconds} for every algorithm implementing `collective`."""
    return {name: alg.cost(collective, world, nbytes, model)
            for name, alg in REGISTRY.items() if collective in alg.COLLECTIVES}


def choose(collective, world, nbytes, algo=None, model=DEFAULT_MODEL):
    """The algorithm to run: `algo` if given (validated), else the cheapest modelled."""
    table = cost_table(collective, world, nbytes, model)
    if algo is None or algo == "auto":
        return min(table, key=table.get)
    if algo not in table:
        known = ", ".join(sorted(table)) or "none"
        raise ValueError(f"unknown algorithm {algo!r} for {collective}; available: {known}")
    return algo


def code(collective, world, nbytes, algo=None, model=DEFAULT_MODEL):
    """The engine code of the algorithm `choose` returns."""
    return REGISTRY[choose(collective, world, nbytes, algo, model)].CODE
