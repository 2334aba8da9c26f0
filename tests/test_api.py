"""Bad input gets a clear TypeError/ValueError, raised before any data moves."""
import numpy as np
import pytest

import shmcoll
from shmcoll.ops import ReduceOp, op_code
from workers import call_after_close, expect_error, expect_local_error

F32 = np.zeros(8, np.float32)

BAD_CALLS = [
    # (method, args, kwargs, exception class name, words in the message)
    ("allreduce", (np.zeros(4, np.complex64),), {"op": "prod"}, "ValueError", "sum and avg only"),
    ("allreduce", (np.zeros(4, bool),), {}, "ValueError", "a sum or product of booleans"),
    ("allreduce", (np.zeros(4, "<U3"),), {}, "TypeError", "unsupported dtype"),
    ("allreduce", (np.zeros(4, object),), {}, "TypeError", "unsupported dtype"),
    ("allreduce", (F32,), {"out": np.zeros(8, np.float64)}, "TypeError", "dtype"),
    ("allreduce", (F32,), {"out": np.zeros(9, np.float32)}, "ValueError", "shape"),
    ("allreduce", (F32,), {"out": np.zeros((2, 4), np.float32)}, "ValueError", "shape"),
    ("allreduce", (F32,), {"out": [0.0] * 8}, "TypeError", "ndarray"),
    ("allreduce", (F32,), {"op": "median"}, "ValueError", "unknown reduction op"),
    ("allreduce", (F32,), {"op": 3}, "ValueError", "unknown reduction op"),
    ("allreduce", (F32,), {"op": "band"}, "ValueError", "not defined for dtype float32"),
    ("allreduce", (F32,), {"algo": "butterfly"}, "ValueError", "unknown algorithm"),
    ("reduce_scatter", (np.zeros(5, np.float32),), {}, "ValueError", "divisible"),
    ("reduce_scatter", (np.float32(1.0),), {}, "ValueError", "divisible"),
    ("reduce_scatter", (np.zeros(8, np.float32),), {"out": np.zeros(3, np.float32)},
     "ValueError", "shape"),
    ("allgather", (F32,), {"out": np.zeros((2, 8), np.int32)}, "TypeError", "dtype"),
    ("allgather", (F32,), {"out": np.zeros((3, 8), np.float32)}, "ValueError", "shape"),
    ("allgather", (np.zeros(3, object),), {}, "TypeError", "Python objects"),
    ("broadcast", (F32,), {"root": 2}, "ValueError", "root 2 is out of range"),
    ("broadcast", (F32,), {"root": -1}, "ValueError", "out of range"),
    ("broadcast", (F32,), {"root": "0"}, "TypeError", "root must be an integer"),
    ("broadcast", ([1.0, 2.0],), {}, "TypeError", "numpy.ndarray"),
    ("broadcast", (F32,), {"algo": "rhd"}, "ValueError", "unknown algorithm 'rhd' for broadcast"),
    ("reduce", (F32,), {"root": 5}, "ValueError", "out of range"),
    ("reduce", (F32,), {"op": "bxor"}, "ValueError", "not defined"),
    ("reduce", (np.zeros(2, np.complex128),), {"op": "min"}, "ValueError", "not defined"),
    ("reduce", (np.zeros(2, np.float32),), {"out": bytes(8)}, "ValueError", "read-only"),
    ("gather", (F32,), {"out": np.zeros((2, 9), np.float32)}, "ValueError", "shape"),
    ("gather", (F32,), {"root": 3}, "ValueError", "out of range"),
    ("scatter", (None,), {}, "ValueError", "must pass out"),
    ("scatter", (np.zeros((3, 2)),), {}, "ValueError", "x.shape[0] == world_size"),
    ("scatter", (np.zeros((2, 2)),), {"out": np.zeros(3)}, "ValueError", "shape"),
    ("scatter", (np.zeros((2, 2)),), {"algo": "ring"}, "ValueError", "unknown algorithm 'ring'"),
    ("allreduce", (F32,), {"algo": 3}, "ValueError", "algo must be an algorithm name"),
]


@pytest.mark.parametrize("method,args,kwargs,exc,words", BAD_CALLS,
                         ids=[f"{c[0]}-{c[4]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_is_refused_clearly(pools, method, args, kwargs, exc, words):
    results = pools(2).run(expect_error, method, args, kwargs)
    for res in results:
        assert res is not None, "the call should have failed"
        name, mro, message = res
        assert exc in mro
        assert "ShmcollError" in mro or exc in ("TypeError", "ValueError")
        assert words in message


LOCAL_BAD_CALLS = [
    ("strided_broadcast", "ValueError", "C-contiguous"),
    ("read_only_broadcast", "ValueError", "read-only"),
    ("read_only_out", "ValueError", "read-only"),
    ("partial_overlap", "ValueError", "overlaps"),
    ("strided_out", "ValueError", "contiguous"),
    ("big_endian_input", "TypeError", "unsupported dtype >f4"),
]


@pytest.mark.parametrize("name,exc,words", LOCAL_BAD_CALLS, ids=[c[0] for c in LOCAL_BAD_CALLS])
def test_bad_buffers_are_refused_clearly(pools, name, exc, words):
    for res in pools(2).run(expect_local_error, name):
        assert res is not None, "the call should have failed"
        assert res[0] == exc and words in res[2]


def test_communicator_still_works_after_refused_calls(pools):
    from workers import allreduce_sum_of_rank
    assert pools(2).run(allreduce_sum_of_rank) == [135.0, 135.0]


def test_non_contiguous_and_list_inputs_are_copied(pools):
    res = pools(2).run(_strided_inputs)
    for strided, listed in res:
        np.testing.assert_array_equal(strided, np.arange(0, 16, 2, dtype=np.float32) * 2 + 1)
        np.testing.assert_array_equal(listed, [3, 3, 3])


def _strided_inputs(comm):
    x = np.arange(16, dtype=np.float32)[::2] + comm.rank
    return comm.allreduce(x), comm.allreduce([comm.rank + 1] * 3)


def test_closed_communicator_raises(pools):
    name, message = shmcoll.launch(call_after_close, 1)[0]
    assert name == "ClosedError" and "closed" in message
    assert issubclass(shmcoll.ClosedError, ValueError)


def test_reduce_op_names_and_members_are_interchangeable():
    assert op_code("sum") == op_code(ReduceOp.SUM) == op_code("SUM") == 0
    assert ReduceOp.AVG == "avg"
    with pytest.raises(ValueError, match="unknown reduction op"):
        op_code(None)


def test_timeout_error_is_also_the_builtin():
    assert issubclass(shmcoll.TimeoutError, TimeoutError)
    assert issubclass(shmcoll.TimeoutError, shmcoll.ShmcollError)


def test_a_forked_child_cannot_use_its_parents_communicator():
    from workers import use_in_forked_child
    for message, total in shmcoll.launch(use_in_forked_child, 2):
        assert message.startswith("ClosedError") and "forked child" in message
        assert total == 8.0              # the parents' communicator is intact


def test_refused_calls_write_nothing_to_out(pools):
    from workers import refused_calls_leave_out_untouched
    for errors, untouched in pools(2).run(refused_calls_leave_out_untouched):
        assert errors == 6 and untouched
