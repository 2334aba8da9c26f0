"""Ranks that make different calls get MismatchError — every rank of the job, at that
very call, whatever the schedule's shape, whether the call moves data or not — instead
of a hang, a result mixed from two calls, or success on the ranks that exchanged
nothing with the odd one."""
import secrets

import pytest

import shmcoll
from shmcoll.collectives import NAMES, ROOTED
from shmcoll._engine import EAGER_BYTES, INLINE_BYTES
from shmcoll.tuning.algorithms.direct import INLINE_COLLECTIVES
from shmcoll.tuning.selector import algorithms_for
from workers import call_sequences, mismatched_calls, typed_broadcasts

F32 = "float32"


def spec(kind="allreduce", count=1000, dtype=F32, op="sum", algo=None, root=0):
    return (kind, count, dtype, op, algo, root)


def odd_last(base, odd, world=4):
    """Every rank makes `base` but the last, which makes `odd`."""
    return [[base]] * (world - 1) + [[odd]]


def class_matrix(world=4):
    """(id, field, calls per rank): for every collective and algorithm, the last rank
    (the farthest from root 0 in every tree) differs in count, dtype or root."""
    cases = []
    for kind in NAMES:
        for algo in algorithms_for(kind):
            base = spec(kind, 1000, algo=algo)
            cases.append((f"{kind}-{algo}-count", "count",
                          odd_last(base, spec(kind, 2000, algo=algo), world)))
            cases.append((f"{kind}-{algo}-dtype", "dtype",
                          odd_last(base, spec(kind, 1000, "int32", algo=algo), world)))
            if kind in ROOTED:
                cases.append((f"{kind}-{algo}-root", "root",
                              odd_last(base, spec(kind, 1000, algo=algo, root=1), world)))
                # the odd rank right next to the root, and the root itself odd
                cases.append((f"{kind}-{algo}-count-rank1", "count",
                              [[base], [spec(kind, 2000, algo=algo)]] + [[base]] * (world - 2)))
                cases.append((f"{kind}-{algo}-root-on-root", "root",
                              [[spec(kind, 1000, algo=algo, root=2)]] + [[base]] * (world - 1)))
    return cases


def zero_size_cases(world=4):
    empty = [spec(kind, 0) for kind in ("allreduce", "allgather", "broadcast", "reduce",
                                        "gather", "scatter", "reduce_scatter")]
    return [
        ("empty-vs-full", "count", odd_last(spec(count=1000), spec(count=0), world)),
        ("full-vs-empty", "count", odd_last(spec(count=0), spec(count=1000), world)),
        ("empty-other-collectives", "collective", [[empty[r % len(empty)]] for r in range(world)]),
        ("empty-barrier-vs-allreduce", "collective", odd_last(spec(count=0), spec("barrier"), world)),
        ("empty-dtype", "dtype", odd_last(spec(count=0), spec(count=0, dtype="int32"), world)),
        ("empty-root", "root", odd_last(spec("broadcast", 0), spec("broadcast", 0, root=world - 1), world)),
        ("empty-op", "op", odd_last(spec(count=0), spec(count=0, op="max"), world)),
        ("scalar-vs-one", "collective", odd_last(spec(count=-1), spec("allgather", 1), world)),
    ]


def inline_cases(world=4):
    """Calls whose every rank's part rides in its call record (direct's inline
    schedule), the last rank's differing in each field; against a call one element
    too big for the records, which runs eager (its part in a buffer beside the record);
    and an eager call against one too big for that, which runs through the channels
    (that rank waits for data its peers never send: their check of its record must
    stop it).  (Eager calls differing in each field: class_matrix's direct cases.)"""
    cases = []
    for kind in INLINE_COLLECTIVES:
        base = spec(kind, 3)
        cases += [(f"inline-{kind}-count", "count", odd_last(base, spec(kind, 2), world)),
                  (f"inline-{kind}-dtype", "dtype", odd_last(base, spec(kind, 3, "int32"), world))]
        if kind in ROOTED:
            cases.append((f"inline-{kind}-root", "root",
                          odd_last(base, spec(kind, 3, root=1), world)))
    for smaller, larger, limit in (("inline", "eager", INLINE_BYTES // 4),
                                   ("eager", "channel", EAGER_BYTES // 4)):    # (float32)
        for kind in ("allreduce", "broadcast", "reduce", "allgather"):
            below, above = spec(kind, limit, algo="direct"), spec(kind, limit + 1, algo="direct")
            cases += [(f"{smaller}-vs-{larger}-{kind}", "count", odd_last(below, above, world)),
                      (f"{larger}-vs-{smaller}-{kind}", "count", odd_last(above, below, world))]
    cases.append(("inline-allreduce-vs-allgather", "collective",
                  odd_last(spec("allreduce", 3), spec("allgather", 3), world)))
    return cases


def run_cases(cases, world):
    job = "mm-" + secrets.token_hex(4)
    per_case = [calls for _, _, calls in cases]
    return shmcoll.launch(call_sequences, world, args=(job, per_case), timeout=60)


def assert_every_rank_raised_at_first_call(cases, results):
    for i, (name, field, _) in enumerate(cases):
        for rank, outcomes in enumerate(results):
            kind, got_field, text = outcomes[i][0]
            assert kind == "MismatchError", (name, rank, outcomes[i])
            assert got_field == field, (name, rank, text)
            assert "made different calls" in text, (name, rank, text)


@pytest.mark.parametrize("world", [3, 4])
def test_every_rank_raises_for_every_collective_algorithm_and_field(world):
    cases = class_matrix(world)
    assert_every_rank_raised_at_first_call(cases, run_cases(cases, world))


@pytest.mark.parametrize("world", [2, 4])
def test_calls_that_move_no_data_are_checked_on_every_rank(world):
    cases = zero_size_cases(world)
    assert_every_rank_raised_at_first_call(cases, run_cases(cases, world))


@pytest.mark.parametrize("world", [2, 3])
def test_calls_carried_in_the_records_are_checked_on_every_rank(world):
    cases = inline_cases(world)
    assert_every_rank_raised_at_first_call(cases, run_cases(cases, world))


@pytest.mark.slow
def test_eight_ranks_odd_rank_anywhere():
    world = 8
    cases = [(f"{kind}-r{odd}", "count",
              [[spec(kind, 2000 if r == odd else 1000, algo="tree")] for r in range(world)])
             for kind in ("broadcast", "reduce", "gather", "scatter") for odd in (1, 5, 7)]
    assert_every_rank_raised_at_first_call(cases, run_cases(cases, world))


def test_a_rank_cannot_run_ahead_of_a_slow_peer():
    """Rank 0 makes four empty calls then a broadcast while rank 1 sleeps and then
    broadcasts: rank 0's first call must wait for rank 1's first, see that it differs,
    and nothing of the broadcast may be taken for another call."""
    fast = [spec(count=0)] * 4 + [spec("broadcast", 1000)]
    slow = [spec("sleep", 300), spec("broadcast", 1000)] + [spec(count=0)] * 4
    [r0], [r1] = run_cases([("ahead", None, [fast, slow])], 2)
    assert r0[0][:2] == ("MismatchError", "collective"), r0
    assert r1[0][0] == "ok" and r1[1][:2] == ("MismatchError", "collective"), r1
    assert all(o[0] == "CommunicatorBrokenError" for o in r0[1:] + r1[2:]), (r0, r1)


def test_matching_sequences_with_empty_calls_still_succeed():
    calls = [spec(count=0), spec("broadcast", 0), spec(count=5), spec("gather", 0),
             spec("barrier"), spec("allgather", 0), spec(count=-1)]
    results = run_cases([("same", None, [calls] * 3)], 3)
    assert all(o[0] == "ok" for [outcomes] in results for o in outcomes), results


# (dtypes per rank, expected): the type is part of a copy-only call.
TYPE_CASES = [
    (("float32", "int32"), "dtype"),        # 1.5f would arrive as 1069547520
    (("float32", "float32"), None),
    (("int64", "longlong"), None),          # one type, two spellings
    (("bool", "uint8"), "dtype"),
    (("<f4", ">f4"), "dtype"),
    (("M8[ns]", "M8[us]"), "dtype"),
    (("S4", "S4"), None),
    (("S4", "U1"), "dtype"),
    (("f4,i4", "f4,i4"), None),
    (("f4,i4", "i4,f4"), "dtype"),
    (("complex64", "float64"), "dtype"),
    (("uint8", "uint8"), None),
]


def test_copy_only_collectives_compare_types():
    job = "ty-" + secrets.token_hex(4)
    results = shmcoll.launch(typed_broadcasts, 2, args=(job, [c for c, _ in TYPE_CASES]),
                             timeout=60)
    first = results[0][0][0][2]
    assert "float32 on rank 0" in first and "int32 on rank 1" in first, first
    # a byte-swapped dtype is hashed: rank 1 names its own, rank 0 says it cannot
    swapped = [results[r][TYPE_CASES.index((("<f4", ">f4"), "dtype"))][0][2] for r in (0, 1)]
    assert "one this process never passed (type code" in swapped[0], swapped[0]
    assert ">f4 on rank 1" in swapped[1], swapped[1]
    for i, (dtypes, field) in enumerate(TYPE_CASES):
        for rank in range(2):
            (kind, got_field, text), received = results[rank][i]
            if field is None:
                assert kind == "ok", (dtypes, rank, text)
                assert received[:len(results[0][i][1])] == results[0][i][1], (dtypes, rank)
            else:
                assert (kind, got_field) == ("MismatchError", field), (dtypes, rank, text)
                assert "made different calls: dtype" in text, text
        if field is not None:
            assert results[1][i][1] == [0] * len(results[1][i][1]), dtypes   # nothing delivered


def test_copy_only_type_mismatch_in_every_copy_collective():
    cases = [(f"{kind}-{algo}", "dtype",
              odd_last(spec(kind, 16, algo=algo), spec(kind, 16, "int32", algo=algo), 3))
             for kind in ("allgather", "gather", "scatter", "broadcast")
             for algo in algorithms_for(kind)]
    assert_every_rank_raised_at_first_call(cases, run_cases(cases, 3))


def test_mismatch_then_barrier_is_broken():
    results = shmcoll.launch(mismatched_calls, 2, args=([spec(), spec(count=999)],), timeout=20)
    for first, then in results:
        assert first[:2] == ("MismatchError", "count")
        assert then[0] == "CommunicatorBrokenError"


def test_mismatch_is_a_value_error():
    assert issubclass(shmcoll.MismatchError, ValueError)
    assert issubclass(shmcoll.MismatchError, shmcoll.ShmcollError)
