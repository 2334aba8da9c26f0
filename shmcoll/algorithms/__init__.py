"""One module per algorithm; each declares the collectives it implements and its
α-β-γ cost.  Adding an algorithm is one module plus one line in REGISTRY."""
from shmcoll.algorithms import direct, ring

REGISTRY = {alg.NAME: alg for alg in (ring, direct)}
