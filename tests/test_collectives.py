"""Every op x dtype x shape at P = 1, 2, 3, 4, 8 against the numpy reference,
in place and out of place, with every rank's result bitwise identical."""
import numpy as np
import pytest

from reference import (ALL_DTYPES, FLOAT_DTYPES, bitwise_equal, make_input, ops_for,
                       reduce_ref, dtype_of)
from workers import run_cases, float_sum_random

WORLDS = [1, 2, 3, 4, 8]
from shmcoll.config import SETTINGS  # noqa: E402

# A chunk is one slot of accumulator elements: LONG crosses chunk boundaries
# (twice for 4-byte accumulators) with blocks of unequal length.
LONG = 2 * SETTINGS["SHMCOLL_SLOT_BYTES"].default // 4 + 5
ALLREDUCE_ALGOS = ["ring", "direct", None]


def allreduce_shapes(P):
    return [(0,), (1,), (max(P - 1, 1),), (13,), (7, 3), ()]


def cases_for(P):
    cases = []
    for dt in ALL_DTYPES:
        for op in ops_for(dt):
            for shape in allreduce_shapes(P):
                for inplace in (False, True):
                    for algo in ALLREDUCE_ALGOS:
                        cases.append(("allreduce", shape, dt, op, inplace, algo))
            for shape in [(0,), (P,), (P * 7, 3)]:
                cases.append(("reduce_scatter", shape, dt, op, False))
            cases.append(("reduce_scatter", (P * 5,), dt, op, True))
        for shape in [(0,), (1,), (13,), (2, 3)]:
            cases.append(("allgather", shape, dt, None, False))
        cases.append(("allgather", (5,), dt, None, True))
    for dt in ("float32", "int64", "float16", "uint8"):
        for op in ("sum", "max"):
            for algo in ALLREDUCE_ALGOS:
                cases.append(("allreduce", (LONG,), dt, op, False, algo))
                cases.append(("allreduce", (LONG + P,), dt, op, True, algo))
            cases.append(("reduce_scatter", (P * (LONG // P),), dt, op, False))
        cases.append(("allgather", (LONG,), dt, None, False))
    return cases


def expected(case, P, rank, seed=0):
    collective, shape, dt, op = case[:4]
    xs = [make_input(r, shape, dt, op or "sum", seed) for r in range(P)]
    if collective == "allgather":
        return np.stack(xs) if xs[0].ndim else np.stack(xs).reshape(P)
    full = reduce_ref(xs, op, dt)
    if collective == "reduce_scatter":
        m = shape[0] // P
        return full[rank * m:(rank + 1) * m]
    return full


@pytest.mark.parametrize("P", WORLDS)
def test_matrix_against_numpy(pools, P):
    cases = [c if c[3] is not None else (c[0], c[1], c[2], "sum") + c[4:] for c in cases_for(P)]
    per_rank = pools(P).run(run_cases, cases)
    wrong = []
    for i, case in enumerate(cases):
        for rank in range(P):
            if not bitwise_equal(per_rank[rank][i], expected(case, P, rank)):
                wrong.append((case, rank))
        if case[0] != "reduce_scatter":
            if not all(bitwise_equal(per_rank[0][i], per_rank[r][i]) for r in range(P)):
                wrong.append((case, "ranks differ"))
    assert not wrong, f"{len(wrong)} wrong of {len(cases)}: {wrong[:10]}"


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("dt", [d for d in FLOAT_DTYPES if d != "bfloat16"])
def test_random_floats_match_numpy_up_to_order(pools, P, dt):
    results = pools(P).run(float_sum_random, 10007, dt, 11)
    xs = [x for x, _ in results]
    want = np.sum(np.stack(xs).astype(np.float64), axis=0)
    rtol = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}[dt]
    for _, got in results:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * 4)
        assert bitwise_equal(got, results[0][1])


def test_nan_propagates_through_min_and_max(pools):
    from workers import run_case  # noqa: F401  (imported for the ranks)
    res = pools(2).run(_nan_minmax)
    for r in res:
        assert np.isnan(r[0][0]) and r[0][1] == 1.0
        assert np.isnan(r[1][0]) and r[1][1] == 2.0


def _nan_minmax(comm):
    x = np.array([np.nan if comm.rank == 1 else 1.0, comm.rank + 1.0], np.float32)
    return comm.allreduce(x, op="min"), comm.allreduce(x, op="max")


def test_small_slots_stress_pipeline(monkeypatch):
    """Two 128-byte slots per channel: hundreds of pipeline rounds, uneven blocks."""
    import shmcoll
    from workers import run_cases as rc
    monkeypatch.setenv("SHMCOLL_SLOT_BYTES", "128")
    monkeypatch.setenv("SHMCOLL_SLOTS", "2")
    P = 3
    cases = [("allreduce", (1001,), "float32", "sum", False, "ring"),
             ("allreduce", (1001,), "float16", "avg", True, "ring"),
             ("allreduce", (1001,), "int32", "min", False, "direct"),
             ("allreduce", (777,), "float64", "prod", True, "direct"),
             ("reduce_scatter", (P * 333,), "int64", "prod", False),
             ("allgather", (517,), "uint8", "sum", False)]
    per_rank = shmcoll.launch(rc, P, args=(cases,))
    for i, case in enumerate(cases):
        for rank in range(P):
            assert bitwise_equal(per_rank[rank][i], expected(case, P, rank)), (case, rank)


def test_dtype_of_results_is_preserved(pools):
    res = pools(2).run(run_cases, [("allreduce", (4,), dt, "sum", False) for dt in ALL_DTYPES])
    assert [r.dtype for r in res[0]] == [dtype_of(dt) for dt in ALL_DTYPES]
