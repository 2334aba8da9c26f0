"""Every collective x algorithm x op x dtype x shape at P = 1, 2, 3, 4, 5, 8 against
the numpy reference, in place and out of place, with odd roots, and every rank's
result bitwise identical (beyond four ranks a fixed half of the cases; all with
`pytest --full`).  Inputs are small integers, so every summation order gives
the same bits and the reference can be exact for all algorithms."""
import zlib

import numpy as np
import pytest

from reference import (ALL_DTYPES, FLOAT_DTYPES, bitwise_equal, expected_result, ops_for,
                       dtype_of)
from workers import (algorithm_labels, inline_nonblocking, run_cases, float_sum_random,
                     random_allreduce_every_way)
from shmcoll import _engine
from shmcoll._core.settings import SETTINGS
from shmcoll.collectives import NAMES, REDUCING, ROOTED
from shmcoll.tuning.algorithms.direct import INLINE_COLLECTIVES
from shmcoll.tuning.selector import algorithms_for

WORLDS = [1, 2, 3, 4, 5, 8]

# A chunk is one slot of accumulator elements: LONG crosses chunk boundaries
# (twice for 4-byte accumulators) with blocks of unequal length.
LONG = 2 * SETTINGS["SHMCOLL_SLOT_BYTES"].default // 4 + 5
COPYING = tuple(c for c in NAMES if c not in REDUCING)


def algos(collective):
    return algorithms_for(collective) + [None]


def roots(P):
    return sorted({0, P - 1, P // 2})


def shapes_for(collective, P):
    if collective == "reduce_scatter":
        return [(0,), (P,), (P * 7, 3)]
    return [(0,), (1,), (max(P - 1, 1),), (13,), (7, 3), ()]


# Schedules depend on the element size and on whether partials widen (float16,
# bfloat16), not on the type otherwise: beyond four ranks, one dtype of each kind.
REPRESENTATIVE = [d for d in ("int8", "uint16", "float16", "bfloat16", "int32", "float64")
                  if d in ALL_DTYPES]


def cases_for(P):
    """(collective, shape, dtype, op, inplace, algo, seed, root) for every combination."""
    cases = []
    for coll in REDUCING + COPYING:
        for algo in algos(coll):
            for root in (roots(P) if coll in ROOTED else [0]):
                for dt in (ALL_DTYPES if P <= 4 else REPRESENTATIVE):
                    for op in (ops_for(dt) if coll in REDUCING else ["sum"]):
                        for shape in shapes_for(coll, P):
                            for inplace in (False, True):
                                cases.append((coll, shape, dt, op, inplace, algo, 0, root))
    for coll in REDUCING + COPYING:
        for algo in algos(coll):
            for dt in ("float32", "int64", "float16", "uint8"):
                for op in (("sum", "max") if coll in REDUCING else ("sum",)):
                    n = P * (LONG // P) if coll == "reduce_scatter" else LONG
                    cases.append((coll, (n,), dt, op, False, algo, 0, P - 1))
                    cases.append((coll, (n + P * (coll != "reduce_scatter"),), dt, op, True,
                                  algo, 0, P // 2))
    return cases


def fixed_half(cases):
    """Half of `cases`, the same half on every run (by a hash of each case, so every
    collective, algorithm and dtype keeps about half of its cases)."""
    return [c for c in cases if zlib.crc32(repr(c).encode()) % 2 == 0]


@pytest.mark.parametrize("P", WORLDS)
def test_matrix_against_numpy(pools, full, P):
    cases = cases_for(P)
    if P > 4 and not full:      # beyond four ranks schedules repeat their shapes
        cases = fixed_half(cases)
    per_rank = pools(P).run(run_cases, cases)
    wrong = []
    for i, case in enumerate(cases):
        for rank in range(P):
            if not bitwise_equal(per_rank[rank][i], expected_result(case, P, rank)):
                wrong.append((case, rank))
        if case[0] in ("allreduce", "allgather", "broadcast"):
            if not all(bitwise_equal(per_rank[0][i], per_rank[r][i]) for r in range(P)):
                wrong.append((case, "ranks differ"))
    assert not wrong, f"{len(wrong)} wrong of {len(cases)}: {wrong[:10]}"


def test_copy_collectives_take_any_plain_dtype(pools):
    per_rank = pools(3).run(_exotic_dtypes)
    for rank, (bc, ga, ag, sc) in enumerate(per_rank):
        np.testing.assert_array_equal(bc, np.array([1 + 2j, 3j], np.complex128))
        assert ga is None if rank else ga.tolist() == [[True, False], [False, True], [True, True]]
        assert ag["a"].tolist() == [0, 1, 2] and ag["b"].tolist() == [0.5, 1.5, 2.5]
        assert sc.tolist() == [rank % 2 == 0]


def _exotic_dtypes(comm):
    r = comm.rank
    bc = np.array([1 + 2j, 3j]) if r == 1 else np.zeros(2, np.complex128)
    comm.broadcast(bc, root=1)
    flags = np.array([[True, False], [False, True], [True, True]])
    ga = comm.gather(flags[r], root=0)
    rec = np.zeros((), dtype=[("a", "i4"), ("b", "f8")])
    rec["a"], rec["b"] = r, r + 0.5
    ag = comm.allgather(rec)
    sc = comm.scatter(np.array([[True], [False], [True]]) if r == 2 else None,
                      out=np.empty(1, bool), root=2)
    return bc, ga, ag, sc


@pytest.mark.parametrize("dt", [">f8", ">i4", ">u2", "<f4"])
def test_copy_collectives_keep_the_byte_order_of_x(pools, dt):
    """A result the library allocates has x's dtype, byte order included: the bytes are
    copied as they are, and a native array in their place would read them swapped
    (the uneven-block forms too: numpy's stack and concatenate return native order)."""
    P = 3
    value = lambda *v: np.array(v, dt)      # noqa: E731
    for rank, got in enumerate(pools(P).run(_byte_order_calls, dt)):
        want = {"allgather": value(*[[10 * q, 10 * q + 1] for q in range(P)]),
                "gather": value(*[[10 * q, 10 * q + 1] for q in range(P)]) if rank == 0 else None,
                "alltoall": value(*[[10 * q + rank] for q in range(P)]),
                "sendrecv": value(10 * ((rank - 1) % P), 10 * ((rank - 1) % P) + 1),
                "scatter (out allocated)": value(2 * rank, 2 * rank + 1),
                "scatter (out given)": value(2 * rank, 2 * rank + 1),
                "broadcast": value(20, 21),
                "allgatherv": value(*[10 * q + i for q in range(P) for i in range(q + 1)]),
                "gatherv": value(*[10 * q + i for q in range(P) for i in range(q + 1)])
                if rank == 0 else None,
                "scatterv": value(*range(rank * (rank + 1) // 2, (rank + 1) * (rank + 2) // 2)),
                "alltoallv": value(*[10 * q + rank for q in range(P)])}
        for name, (order, result) in got.items():
            if want[name] is None:
                assert result is None, (name, rank)
                continue
            assert order == np.dtype(dt).str, (name, rank, order)
            np.testing.assert_array_equal(result, want[name], err_msg=f"{name} on rank {rank}")


def _byte_order_calls(comm, dt):
    r, P = comm.rank, comm.world_size
    x = np.array([10 * r, 10 * r + 1], dt)
    rows = np.arange(2 * P, dtype=dt).reshape(P, 2)
    got = {"allgather": comm.allgather(x), "gather": comm.gather(x, root=0),
            "alltoall": comm.alltoall(np.array([[10 * r + q] for q in range(P)], dt)),
            "sendrecv": comm.sendrecv(x, dst=(r + 1) % P, src=(r - 1) % P),
            "scatter (out allocated)": comm.scatter(rows, root=0),
            "scatter (out given)": comm.scatter(rows if r == 0 else None,
                                                out=np.empty(2, dt), root=0),
            "broadcast": comm.broadcast(x.copy(), root=2),
            "allgatherv": comm.allgatherv(np.array([10 * r + i for i in range(r + 1)], dt)),
            "gatherv": comm.gatherv(np.array([10 * r + i for i in range(r + 1)], dt), root=0),
            "scatterv": comm.scatterv(np.arange(P * (P + 1) // 2, dtype=dt) if r == 0 else None,
                                      list(range(1, P + 1)) if r == 0 else None, root=0),
            "alltoallv": comm.alltoallv(np.array([10 * r + q for q in range(P)], dt),
                                        [1] * P)}
    # (the byte order as the rank sees it: pickling brings arrays back in native order)
    return {name: (None, None) if a is None else (a.dtype.str, a) for name, a in got.items()}


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


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("algo", algorithms_for("allreduce"))
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
@pytest.mark.parametrize("count", [1001, LONG])     # one chunk; several, uneven blocks
def test_random_floats_give_every_rank_the_same_bits_in_place_too(pools, P, algo, op, count):
    """Where the order of a sum changes its bits, every rank must still get the same
    bits, in place as out of place (a schedule may take another path on a rank whose
    x is its output), and both must be the same reduction."""
    results = pools(P).run(random_allreduce_every_way, count, "float32", op, algo, 5)
    xs = np.stack([x for x, _, _ in results]).astype(np.float64)
    want = {"sum": xs.sum(0), "max": xs.max(0), "avg": xs.mean(0)}[op]
    for _, apart, inplace in results:
        np.testing.assert_allclose(apart, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(inplace, want, rtol=1e-5, atol=1e-5)
        assert bitwise_equal(apart, results[0][1])
        assert bitwise_equal(inplace, results[0][2])
    if algo == "direct":    # rank order in and out of place
        assert bitwise_equal(results[0][2], results[0][1])


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
    cases += [(coll, (1001,), "int32", "sum", inplace, algo, 0, 1)
              for coll in REDUCING + COPYING if coll != "reduce_scatter"
              for algo in algorithms_for(coll) for inplace in (False, True)]
    per_rank = shmcoll.launch(rc, P, args=(cases,))
    for i, case in enumerate(cases):
        for rank in range(P):
            assert bitwise_equal(per_rank[rank][i], expected_result(case, P, rank)), (case, rank)


@pytest.mark.parametrize("P", [3, 4])
def test_fanned_out_chunks_wait_for_their_slowest_reader(monkeypatch, P):
    """Direct schedules write what every peer gets once, where every peer reads it
    (sc_put_all): many chunks through two 256-byte slots, a late rank every few calls,
    AllReduce, AllGather and Broadcast interleaved on the same channels.  (Counts past
    the eager limit: smaller calls go with the call records.)"""
    import shmcoll
    from workers import fanned_out_calls
    monkeypatch.setenv("SHMCOLL_SLOT_BYTES", "256")
    monkeypatch.setenv("SHMCOLL_SLOTS", "2")
    past_eager = EAGER_LIMIT // 8 + 1       # float64 elements
    counts = (past_eager, past_eager + 1907, 100_003)
    for wrong, ran in shmcoll.launch(fanned_out_calls, P, args=(counts, 12)):
        assert wrong == 0
        assert "direct (two-shot)" in ran and ran <= {"direct (one-shot)", "direct (two-shot)"}, ran


INLINE_LIMIT = _engine.INLINE_BYTES
EAGER_LIMIT = _engine.EAGER_BYTES
# The variants of direct that go with the call records, and the most bytes of x each
# carries; the next one up is where a call one element past the limit goes.
WITH_THE_RECORDS = {"inline": (INLINE_LIMIT, "direct (eager)"), "eager": (EAGER_LIMIT, None)}


def record_boundary_cases(P, variant):
    """(cases, [(collective, priced bytes, the label `direct` must run)]): every
    collective with inline and eager schedules at the most `variant` carries with the
    call records and one element past it."""
    limit, past = WITH_THE_RECORDS[variant]
    cases, sizes = [], []
    for coll in INLINE_COLLECTIVES:
        for dt in ("uint8", "float16", "float32", "float64"):
            isz = dtype_of(dt).itemsize
            rows = P if coll in ("reduce_scatter", "scatter", "alltoall") else 1
            fits = limit // isz // rows
            for count, label in ((fits, f"direct ({variant})"), (fits + 1, past)):
                shape = (count * P,) if coll == "reduce_scatter" else (count,)
                for op in (ops_for(dt) if coll in REDUCING else ["sum"]):
                    for inplace in (False, True):
                        for algo in (None, "direct"):
                            cases.append((coll, shape, dt, op, inplace, algo, 0, P - 1))
                priced = count * isz * (1 if coll in ("allreduce", "broadcast", "reduce") else P)
                sizes.append((coll, priced, label))
    return cases, sizes


@pytest.mark.parametrize("variant", ["inline", "eager"])
@pytest.mark.parametrize("P", [2, 3, 4])
def test_calls_carried_in_the_records_at_their_limit(pools, P, variant):
    """Every rank's part in its call record (direct's inline schedule) up to
    SC_INLINE_BYTES, in its part buffer beside it (eager) up to SC_EAGER_BYTES, through
    the channels one element past that: all right, in place too, and `direct` runs each
    exactly where it fits (what `auto` picks there is the selector's test; a trial may
    settle it otherwise)."""
    cases, sizes = record_boundary_cases(P, variant)
    per_rank = pools(P).run(run_cases, cases)
    wrong = [(case, rank) for i, case in enumerate(cases) for rank in range(P)
             if not bitwise_equal(per_rank[rank][i], expected_result(case, P, rank))]
    assert not wrong, f"{len(wrong)} wrong of {len(cases)}: {wrong[:10]}"
    named = pools(P).run(algorithm_labels, [(c, n, "direct") for c, n, _ in sizes])[0]
    for (coll, n, label), ran in zip(sizes, named):
        if label is None:   # past eager: a channel schedule
            assert ran not in ("direct (inline)", "direct (eager)"), (coll, n, ran)
        elif coll == "allreduce" and ran == "direct (two-shot)":
            # (two-shot moves (3P-2)/P^2 of one-shot's bytes, so the model may prefer it
            # to eager at the limit where P = 4: a choice, not a limit)
            assert variant == "eager" and P >= 4, (coll, n, ran)
        else:
            assert ran == label, (coll, n, ran)


@pytest.mark.parametrize("P", [3, 4])
def test_calls_carried_in_the_records_with_a_rank_late_now_and_then(P):
    """Back-to-back inline (8-48 B) and eager calls (56 B-16 KiB) with a rank late
    every few calls: a rank one call ahead writes its next record, and its part buffer
    of the other parity, while the late one still reads this call's."""
    import shmcoll
    from workers import fanned_out_calls
    counts = (1, 3, 6, 7, 33, 1001, EAGER_LIMIT // 8)    # (float64)
    for wrong, ran in shmcoll.launch(fanned_out_calls, P, args=(counts, 40)):
        assert wrong == 0
        assert ran == {"direct (inline)", "direct (eager)"}, ran


@pytest.mark.parametrize("P", [3, 4])
def test_calls_with_the_records_reduce_in_chunks_of_the_slots(monkeypatch, P):
    """Inline and eager reductions accumulate in the process's scratch, two slots of
    SHMCOLL_SLOT_BYTES: with 64-byte slots a float16 accumulator (float32) of an inline
    call is already larger than a slot, and an eager call's is hundreds of them."""
    monkeypatch.setenv("SHMCOLL_SLOT_BYTES", "64")
    cases = [("allreduce", (n,), dt, op, inplace, "direct")
             for n in (INLINE_LIMIT // 2, 5001, EAGER_LIMIT // 2)
             for dt in ("float16", "bfloat16", "int8") for op in ("sum", "avg", "max")
             if not (dt == "int8" and op == "avg") for inplace in (False, True)]
    cases += [("reduce_scatter", (P * 1001,), "float16", "sum", False, "direct"),
              ("reduce", (5001,), "bfloat16", "avg", False, "direct", 0, P - 1)]
    import shmcoll
    from workers import run_cases as rc
    per_rank = shmcoll.launch(rc, P, args=(cases,))
    for i, case in enumerate(cases):
        for rank in range(P):
            assert bitwise_equal(per_rank[rank][i], expected_result(case, P, rank)), (case, rank)


def test_nonblocking_calls_carried_in_the_records(pools):
    assert pools(3).run(inline_nonblocking, 40) == [[]] * 3
    assert pools(3).run(inline_nonblocking, 40, 1000) == [[]] * 3      # eager


def test_dtype_of_results_is_preserved(pools):
    res = pools(2).run(run_cases, [("allreduce", (4,), dt, "sum", False) for dt in ALL_DTYPES])
    assert [r.dtype for r in res[0]] == [dtype_of(dt) for dt in ALL_DTYPES]
