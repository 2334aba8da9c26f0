"""Uneven blocks (allgatherv, gatherv, scatterv, reduce_scatter with counts) and Python
objects (broadcast/allgather/gather/scatter_object) against numpy and pickle."""
import numpy as np
import pytest

import ragged_workers as rw
from shmcoll.ops import reference_reduce


def expected_uneven(P, counts, tail, dtype, root, rank):
    blocks = [rw.block(q, counts[q], tail, dtype) for q in range(P)]
    full = np.concatenate(blocks)
    xs = [rw.block(100 + q, sum(counts), tail, dtype) for q in range(P)]
    start = sum(counts[:rank])
    rows = slice(start, start + counts[rank])
    return {"allgatherv": full, "gatherv": full if rank == root else None,
            "scatterv": blocks[rank],
            "reduce_scatter": reference_reduce(xs, "sum")[rows],
            "reduce_scatter_max": reference_reduce(xs, "max")[rows]}


@pytest.mark.parametrize("P,counts,tail,dtype", [
    (1, [3], (), "float32"),
    (2, [0, 5], (2, 3), "int64"),
    (3, [4, 0, 1], (3,), "float64"),
    (4, [2, 7, 1, 3], (), "int16"),
    (4, [0, 0, 0, 0], (5,), "float32"),
])
def test_uneven_blocks_against_numpy(pools, P, counts, tail, dtype):
    root = P - 1
    for rank, got in enumerate(pools(P).run(rw.uneven, counts, tail, dtype, root)):
        want = expected_uneven(P, counts, tail, dtype, root, rank)
        for name in want:
            if want[name] is None:
                assert got[name] is None, name
            else:
                assert got[name].dtype == want[name].dtype, name
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_ranks_that_disagree_all_raise_and_go_on(pools):
    for first, second, after in pools(3).run(rw.disagreeing):
        assert first[0] == "shape" and "differ after the first dimension" in first[1]
        assert second[0] == "counts" and "different counts" in second[1]
        assert after == 3.0


@pytest.mark.parametrize("P", [2, 3])
def test_an_argument_one_rank_refuses_is_an_error_on_every_rank(pools, P):
    offender = {"allgatherv": P - 1, "reduce_scatter": P - 1, "scatterv": 0,
                "broadcast_object": 0, "allgather_object": P - 1, "scatter_object": 0}
    for rank, seen in enumerate(pools(P).run(rw.one_rank_refuses)):
        assert seen.pop("after") == float(P)
        for name, (kind, text) in seen.items():
            assert name in text
            if rank == offender[name]:
                assert kind in ("ValueError", "TypeError") and "refused their" not in text
            else:
                assert kind == "ValueError" and f"rank(s) [{offender[name]}]" in text


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("P", [1, 2, 3])
def test_objects(pools, P):
    root = P // 2
    for rank, got in enumerate(pools(P).run(rw.objects, root)):
        assert _same(got["broadcast"], rw.payload(root))
        assert _same(got["allgather"], [rw.payload(q) for q in range(P)])
        assert _same(got["gather"], [rw.payload(q) for q in range(P)] if rank == root else None)
        assert _same(got["scatter"], rw.payload(rank))
        assert got["not_copied_twice"]


def test_argument_errors(pools):
    comm_errors = pools(2).run(rw.bad_calls)
    for errors in comm_errors:
        assert errors == ["ValueError", "ValueError", "TypeError"]

