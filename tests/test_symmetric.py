"""Symmetric allocations (Communicator.empty) and the single-copy schedules that read
peers' arrays in place: every collective, dtype and op against numpy, views at an
offset, in place, the reuse rule under an uneven schedule, nonblocking calls, what a
disagreement gets, and the allocation's lifetime (nothing left in /dev/shm)."""
import numpy as np
import pytest

import symmetric_workers as sw
from shmcoll.ops import reference_reduce

CASES = [("float32", "sum"), ("float64", "max"), ("int32", "prod"), ("int8", "sum"),
         ("float16", "avg"), ("uint64", "bxor")]


def expected(P, r, coll, n, variant, dtype, op):
    root = P - 1
    xs = [sw.rank_values(q, n, dtype) for q in range(P)]
    if coll == "allreduce":
        return reference_reduce(xs, op)
    if coll == "reduce":
        return reference_reduce(xs, op) if r == root else None
    if coll == "reduce_scatter":
        bigs = [sw.rank_values(q, n * P, dtype) for q in range(P)]
        return reference_reduce(bigs, op)[r * n:(r + 1) * n]
    if coll == "allgather":
        return np.stack(xs)
    if coll == "gather":
        return np.stack(xs) if r == root else None
    if coll == "broadcast":
        return xs[root]
    raise AssertionError(coll)


def check_all(results, P, dtype, op):
    for r, got in enumerate(results):
        for (coll, n, variant), value in got.items():
            want = expected(P, r, coll, n, variant, dtype, op)
            where = f"rank {r} {coll} n={n} {variant}"
            if want is None:
                assert value is None, where
                continue
            assert value.dtype == np.dtype(dtype), where
            if np.dtype(dtype).kind == "f":
                np.testing.assert_allclose(value.astype(np.float64), want.astype(np.float64),
                                           rtol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-6,
                                           err_msg=where)
            else:
                np.testing.assert_array_equal(value, want, err_msg=where)


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("dtype,op", CASES)
def test_single_copy_collectives_against_numpy(pools, P, dtype, op):
    check_all(pools(P).run(sw.every_collective, dtype, op, 0, "symmetric"), P, dtype, op)


@pytest.mark.parametrize("P", [2, 4])
def test_views_at_an_offset_and_the_cost_models_choice(pools, P):
    """A view inside the allocation (the same place on every rank) runs single copy;
    with algo=None the cost model picks among every schedule."""
    check_all(pools(P).run(sw.every_collective, "float32", "sum", 3, None), P, "float32", "sum")
    check_all(pools(P).run(sw.every_collective, "float64", "min", 5, "symmetric"), P,
              "float64", "min")


def test_the_cost_model_takes_single_copy_where_it_copies_less(pools):
    plain, symmetric, in_place = (pools(2).run(sw.chosen, 1 << 20)[0][k]
                                  for k in ("plain", "symmetric", "in place"))
    assert plain == "symmetric (one-shot)"
    assert symmetric.startswith("symmetric")
    assert in_place == "symmetric (two-shot)"


@pytest.mark.parametrize("P", [2, 4])
def test_a_rank_may_write_its_array_as_soon_as_the_call_returned(pools, P):
    assert pools(P).run(sw.reuse_at_once, 300) == [0] * P


def test_nonblocking_single_copy(pools):
    P = 3
    want = sum(sw.rank_values(q, 5000, np.float32) for q in range(P))
    for got in pools(P).run(sw.nonblocking):
        np.testing.assert_array_equal(got, want)


def test_allocation_lifetime_and_no_name_left(pools):
    for got in pools(2).run(sw.lifetime):
        assert got["left"] == [], got
        assert got["known"] == (got["known"][0], 0)
        assert got["forgotten"] and got["zeros"] and got["shape"] == (2, 3)


def test_ranks_asking_for_different_arrays_all_raise_and_go_on(pools):
    for outcome in pools(2).run(sw.different_requests):
        assert "ranks asked for different arrays" in outcome[0]
        assert "ranks asked for different arrays" in outcome[1]
        assert outcome[2] == 2.0


@pytest.mark.parametrize("how,field", [("one ordinary", "algorithm"),
                                       ("another offset", "x's symmetric buffer")])
def test_ranks_that_disagree_on_the_buffer_raise_mismatch_everywhere(how, field):
    outcomes = sw.launch(sw.mismatched, 2, how)
    for text in outcomes:
        assert text.startswith("MismatchError") and field in text, text


def test_torch_tensors_over_symmetric_arrays(pools):
    pytest.importorskip("torch")
    P = 2
    want = sum(sw.rank_values(q, 70001, np.float32) for q in range(P))
    for same, got in pools(P).run(sw.torch_tensor_views):
        assert same
        np.testing.assert_array_equal(got, want)


def test_a_peer_that_leaves_mid_call_is_reported_not_waited_for():
    outcomes = sw.launch(sw.peer_leaves, 3)
    assert outcomes[1] == "left"
    for text in (outcomes[0], outcomes[2]):
        assert text.startswith("PeerLostError") and "rank 1" in text, text
