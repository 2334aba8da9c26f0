"""Random collectives, shapes, dtypes, ops and algorithms against the numpy reference."""
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

from reference import ALL_DTYPES, bitwise_equal, expected_result, ops_for  # noqa: E402
from cma_workers import agreement  # noqa: E402
from workers import run_cases, run_cases_symmetric  # noqa: E402
from shmcoll.tuning.algorithms import SINGLE_COPY  # noqa: E402
from shmcoll.collectives import NAMES as ALL_COLLECTIVES, REDUCING  # noqa: E402
from shmcoll.tuning.selector import algorithms_for  # noqa: E402


@st.composite
def cases(draw, P, cross_memory=False):
    collective = draw(st.sampled_from(ALL_COLLECTIVES))
    dt = draw(st.sampled_from(ALL_DTYPES))
    reducing = collective in REDUCING
    op = draw(st.sampled_from(ops_for(dt))) if reducing else "sum"
    ndim = draw(st.integers(1 if collective == "reduce_scatter" else 0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    if collective == "reduce_scatter":
        shape = (shape[0] * P,) + shape[1:]
    inplace = draw(st.booleans()) and (collective != "reduce_scatter" or shape[0] > 0)
    algo = draw(st.sampled_from([None, "auto"] + algorithms_for(collective,
                                                                 cross_memory=cross_memory)))
    return (collective, shape, dt, op, inplace, algo, draw(st.integers(0, 2**16)),
            draw(st.integers(0, P - 1)))


@pytest.mark.parametrize("P", [2, 3, 5])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_cases_match_numpy(pools, P, data):
    """Every algorithm, cma included where the ranks may read each other's memory."""
    cross_memory = pools(P).run(agreement)[0] is not None
    batch = [data.draw(cases(P, cross_memory)) for _ in range(8)]
    per_rank = pools(P).run(run_cases, batch)
    for i, case in enumerate(batch):
        for rank in range(P):
            want = expected_result(case, P, rank)
            assert bitwise_equal(per_rank[rank][i], want), (case, rank)


SINGLE_COPY_COLLECTIVES = sorted({c for alg in SINGLE_COPY.values() for c in alg.COLLECTIVES})


@pytest.mark.parametrize("P", [2, 3, 4])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_random_cases_on_symmetric_buffers_match_numpy(pools, P, data):
    """The same draws on symmetric buffers (x, and out when drawn), forced to single copy
    or left to the cost model."""
    batch, outs = [], []
    for _ in range(8):
        case = data.draw(cases(P))
        while case[0] not in SINGLE_COPY_COLLECTIVES:
            case = data.draw(cases(P))
        algo = data.draw(st.sampled_from([None, "symmetric"]))
        symmetric_out = data.draw(st.booleans())
        batch.append(case[:5] + (algo,) + case[6:])
        outs.append(symmetric_out)
    per_rank = pools(P).run(run_cases_symmetric, batch, outs)
    for i, case in enumerate(batch):
        for rank in range(P):
            want = expected_result(case, P, rank)
            assert bitwise_equal(per_rank[rank][i], want), (case, outs[i], rank)
