"""Algorithm selection: a cost table over the registered algorithms, argmin, override.

Every rank evaluates the same pure function of (collective, bytes, world size), so
every rank reaches the same decision without exchanging a message.

Overrides (SHMCOLL_ALGO) use one grammar: entries separated by ';' or ',', each
either ``ALGO`` (every collective that has it) or ``COLLECTIVE:ALGO``, e.g.
``"ring"`` or ``"allreduce:direct;allgather:ring"``.  A per-collective entry wins
over a plain one; an unknown name is an error.
"""
from dataclasses import dataclass

from shmcoll.algorithms import REGISTRY

COLLECTIVES = tuple(sorted({c for alg in REGISTRY.values() for c in alg.COLLECTIVES}))


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


def code(collective, world, nbytes, algo=None, model=DEFAULT_MODEL, overrides=None):
    """The engine code of the algorithm to run: `algo` if given, else the override
    for this collective, else the cheapest modelled."""
    if algo is None and overrides:
        algo = overrides.get(collective)
    return REGISTRY[choose(collective, world, nbytes, algo, model)].CODE


def parse_overrides(text):
    """SHMCOLL_ALGO text -> {collective: algorithm}; raises ValueError on unknown names."""
    plain, specific = {}, {}
    for entry in filter(None, (e.strip() for e in (text or "").replace(",", ";").split(";"))):
        collective, _, name = entry.rpartition(":")
        collective, name = collective.strip(), name.strip()
        if name not in REGISTRY:
            raise ValueError(f"SHMCOLL_ALGO: unknown algorithm {name!r} in {entry!r}; "
                             f"known: {', '.join(sorted(REGISTRY))}")
        if collective:
            if collective not in COLLECTIVES:
                raise ValueError(f"SHMCOLL_ALGO: unknown collective {collective!r} in {entry!r}")
            if collective not in REGISTRY[name].COLLECTIVES:
                raise ValueError(f"SHMCOLL_ALGO: {name} does not implement {collective}")
            specific[collective] = name
        else:
            plain.update({c: name for c in REGISTRY[name].COLLECTIVES})
    return {**plain, **specific}
