"""Theorem 1 of the seed: AllReduce(x) = AllGather(ReduceScatter(x)).

For every dtype, op, P = 1..8 and AllReduce algorithm, on random inputs.  Which pairs
agree bit for bit follows from the order in which each schedule combines the P
contributions of an element:

  ring  AllReduce  vs ring   RS + AG   bitwise: the AllReduce *is* the ring RS
                                       followed by the ring AG, chunk by chunk
  direct (one- or two-shot) vs direct RS + AG   bitwise: both reduce every
                                       element in rank order 0, 1, …, P-1
  naive AllReduce  vs direct RS + AG   bitwise: rank 0 computes (x1 ⊕ x0) ⊕ x2 ⊕ …,
                                       and one IEEE ⊕ is commutative
  tree, rhd, and any other pairing     equal to rounding: a different association

Integer ops wrap (associative) and min/max pick an operand, so every pair is bitwise
for them; the rounding only matters for float sum, prod and avg.
"""
import numpy as np
import pytest

from reference import ALL_DTYPES, dtype_of, ops_for
from workers import THEOREM1_BITWISE, theorem1

M = 37   # elements per rank's block: odd, so blocks and chunks do not line up neatly

ROUNDING_TOLERANCE = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-5, "float64": 1e-12}


def order_sensitive(dt, op):
    return dt in ROUNDING_TOLERANCE and op in ("sum", "prod", "avg")


@pytest.mark.parametrize("P", range(1, 9))
def test_allreduce_equals_allgather_of_reduce_scatter(pools, P):
    cases = [(dt, op) for dt in ALL_DTYPES for op in ops_for(dt)]
    per_rank = pools(P).run(theorem1, cases, M)
    problems = []
    for rank in range(P):
        for (dt, op), (full, split) in zip(cases, per_rank[rank]):
            for algo, got in full.items():
                for via, want in split.items():
                    bitwise = (algo, via) in THEOREM1_BITWISE or not order_sensitive(dt, op) or P <= 2
                    if bitwise:
                        same = got.tobytes() == want.tobytes()
                    else:
                        tol = ROUNDING_TOLERANCE[dt]
                        a, b = got.astype(np.float64), want.astype(np.float64)
                        scale = np.abs(a).max() + np.abs(b).max() + 1
                        same = np.allclose(a, b, rtol=tol, atol=tol * scale)
                    if not same:
                        problems.append((rank, dt, op, algo, via, "bitwise" if bitwise else "close"))
    assert not problems, problems[:10]


def test_every_rank_gets_the_same_bits_from_every_algorithm(pools):
    P = 5
    cases = [(dt, "sum") for dt in ("float16", "bfloat16", "float32", "float64") if dt in ALL_DTYPES]
    per_rank = pools(P).run(theorem1, cases, M)
    for i, (dt, _) in enumerate(cases):
        for algo, mine in per_rank[0][i][0].items():
            for rank in range(1, P):
                assert per_rank[rank][i][0][algo].tobytes() == mine.tobytes(), (dt, algo, rank)
        assert per_rank[0][i][0]["ring"].dtype == dtype_of(dt)
