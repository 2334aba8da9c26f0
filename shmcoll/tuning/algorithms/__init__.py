"""One module per algorithm; each declares the collectives it implements and, per
collective, its variants with their cost terms (algorithms.terms).  Adding an
algorithm is one module plus one entry in REGISTRY.

REGISTRY holds the schedules that run on any arrays; SINGLE_COPY those that need x
in a symmetric allocation (Communicator.empty), priced only for such calls;
CROSS_MEMORY those that need every rank to reach every other's memory (cma), priced
only on communicators whose ranks agreed they can."""
from shmcoll.tuning.algorithms import bruck, cma, direct, naive, rhd, ring, symmetric, tree

REGISTRY = {alg.NAME: alg for alg in (ring, direct, tree, rhd, naive, bruck)}
SINGLE_COPY = {symmetric.NAME: symmetric}
CROSS_MEMORY = {cma.NAME: cma}
ALL = {**REGISTRY, **SINGLE_COPY, **CROSS_MEMORY}



def variants_of(alg, collective, world):
    """{variant: engine code} of every variant `alg` has for `collective` at some size:
    those of an empty call and of a 4 KiB one (direct's eager variant shows only past
    what the call records carry)."""
    found = {}
    for nbytes in (0, 4096):
        for variant, code, _ in alg.variants(collective, world, nbytes):
            found.setdefault(variant, code)
    return found


# (engine code, collective) -> (algorithm, variant), for logs and mismatch reports.
_VARIANT_OF_CODE = {}
for _alg in ALL.values():
    for _coll in _alg.COLLECTIVES:
        for _variant, _code in variants_of(_alg, _coll, 2).items():
            _VARIANT_OF_CODE[_code, _coll] = (_alg.NAME, _variant)
            _VARIANT_OF_CODE.setdefault((_code, None), (_alg.NAME, _alg.NAME))


def name_of_code(code, collective=None):
    """'direct (two-shot)' for an engine code; the code itself if unknown."""
    name, variant = _VARIANT_OF_CODE.get((code, collective), _VARIANT_OF_CODE.get(
        (code, None), (str(code), str(code))))
    return name if variant == name else f"{name} ({variant})"
