"""Ranks that make different calls get MismatchError, naming the field and the ranks,
instead of a hang or a result mixed from two calls."""
import pytest

import shmcoll
from workers import mismatched_calls

F32 = "float32"


def spec(kind="allreduce", count=1000, dtype=F32, op="sum", algo=None, root=0):
    return (kind, count, dtype, op, algo, root)


CASES = [
    ("count", [spec(count=1000), spec(count=999)]),
    ("count", [spec(count=1 << 20), spec(count=(1 << 20) + 1)]),
    ("collective", [spec(), spec(kind="allgather")]),
    ("collective", [spec(), spec(kind="barrier")]),
    ("dtype", [spec(dtype="float32"), spec(dtype="int32")]),
    ("op", [spec(op="sum"), spec(op="max")]),
    ("algorithm", [spec(count=8, algo="ring"), spec(count=8, algo="direct")]),
    ("count", [spec(kind="reduce_scatter", count=6), spec(kind="reduce_scatter", count=8)]),
    ("collective", [spec(), spec(), spec(kind="reduce_scatter", count=999)]),
    ("count", [spec(count=10), spec(count=10), spec(count=11)]),
    # rooted calls: a rank that only sends still checks whom it sent to
    ("root", [spec(kind="broadcast", root=0), spec(kind="broadcast", root=1)]),
    ("root", [spec(kind="broadcast", root=0, algo="tree")] * 2 +
     [spec(kind="broadcast", root=2, algo="tree")]),
    ("root", [spec(kind="reduce", root=1), spec(kind="reduce", root=0)]),
    ("collective", [spec(kind="gather"), spec(kind="scatter")]),
    ("collective", [spec(kind="broadcast"), spec(kind="reduce")]),
    ("algorithm", [spec(kind="broadcast", algo="tree"), spec(kind="broadcast", algo="ring"),
                   spec(kind="broadcast", algo="tree")]),
    ("count", [spec(kind="scatter", count=4, root=1), spec(kind="scatter", count=5, root=1)]),
]


@pytest.mark.parametrize("field,specs", CASES, ids=[f"{c[0]}-P{len(c[1])}-{i}" for i, c in enumerate(CASES)])
def test_every_rank_raises_mismatch_naming_the_field(field, specs):
    results = shmcoll.launch(mismatched_calls, len(specs), args=(specs,), timeout=20)
    for rank, (first, then) in enumerate(results):
        # each rank fails at its call, or at the next one when its own call moved no data
        failure = first if first[0] != "ok" else then
        assert failure[0] == "MismatchError", (rank, first, then)
        assert failure[1] == field, (rank, failure)
        assert "made different calls" in failure[2]
        if first[0] == "MismatchError":
            assert then[0] == "CommunicatorBrokenError"


def test_empty_call_against_a_real_one():
    specs = [spec(count=0), spec(count=8)]
    results = shmcoll.launch(mismatched_calls, 2, args=(specs,), timeout=20)
    assert results[1][0][0] == "MismatchError" and results[1][0][1] == "count"
    assert results[0][0][0] == "ok"               # nothing to receive: no check possible
    assert results[0][1][0] == "MismatchError"    # ... but its next call learns of it


def test_mismatch_is_a_value_error():
    assert issubclass(shmcoll.MismatchError, ValueError)
    assert issubclass(shmcoll.MismatchError, shmcoll.ShmcollError)
