"""alltoall (direct and Bruck) and alltoallv against numpy, at P = 1..8, every
dtype, sizes 0, 1, ragged and several slots; arguments refused on every rank; and
ReduceScatter/AllGather by recursive halving/doubling (Theorem 1 for rhd)."""
import numpy as np
import pytest

import exchange_workers as xw
from reference import ALL_DTYPES, FLOAT_DTYPES, bitwise_equal, dtype_of
from shmcoll._core.settings import SETTINGS

ROWS = [(), (0,), (1,), (7, 3), (40_001,)]       # the last: several 256 KiB slots


@pytest.mark.parametrize("P", range(1, 9))
def test_alltoall_against_numpy(pools, full, P):
    if P in (6, 7) and not full:
        pytest.skip("P = 6, 7 run with --full: 5 and 8 cover odd and even beyond four")
    cases = [(dt, row, algo) for algo in ("direct", "bruck", None)
             for dt, row in [("float32", r) for r in ROWS] +
             [(dt, (5,)) for dt in ALL_DTYPES + ["bool", "complex128"]]]
    for rank, problems in enumerate(pools(P).run(xw.alltoall_cases, cases)):
        assert problems == [], (rank, problems[:5])


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8])
def test_alltoallv_against_numpy(pools, P):
    cases = [("float64", (), 1), ("int16", (3,), 2), ("uint8", (2, 2), 0),
             ("float32", (), 30_000)]
    for rank, problems in enumerate(pools(P).run(xw.alltoallv_cases, cases)):
        assert problems == [], (rank, problems[:5])


@pytest.mark.parametrize("P", [1, 2, 4])
def test_bad_arguments_are_refused_on_every_rank(pools, P):
    for rank, seen in enumerate(pools(P).run(xw.alltoall_refusals)):
        assert seen.pop("after") == float(P)
        assert seen["rows"][0] == "ValueError" and "world_size" in seen["rows"][1]
        assert seen["in_place"][0] == "ValueError" and "overlaps" in seen["in_place"][1]
        for name in ("counts_length", "counts_sum"):
            assert seen[name][0] in ("ValueError", "TypeError"), name
        kind, text = seen["recv_counts"]
        assert kind == "MismatchError" and "expects 1 rows from rank 0" in text, text
        if P > 1:
            kind, text = seen["tail"]
            assert "differ in shape" in text


@pytest.mark.parametrize("P", [3, 5, 6])
@pytest.mark.parametrize("dt", [d for d in ("float16", "bfloat16") if d in FLOAT_DTYPES])
def test_rhd_reduce_scatter_hands_a_widened_block_past_one_slot_to_its_folded_rank(pools, P, dt):
    """Where P is not a power of two, a rank that sat out gets its finished block from
    its neighbour: float16 and bfloat16 travel there as items, not accumulators, so a
    slot holds twice the elements.  A block of more than a slot of accumulators once
    arrived half wrong, and the slot left over desynchronised the next call."""
    m = SETTINGS["SHMCOLL_SLOT_BYTES"].default // 4 + 5
    want = sum((np.arange(P * m) % 5 + q) for q in range(P)).astype(dtype_of(dt))
    for rank, (got, after) in enumerate(pools(P).run(xw.rhd_widened_reduce_scatter, m, dt)):
        assert bitwise_equal(got, want[rank * m:(rank + 1) * m]), rank
        assert after == P * (P + 1) // 2, rank


@pytest.mark.parametrize("P", range(2, 9))
def test_rhd_reduce_scatter_then_allgather_is_the_halving_allreduce(pools, P):
    for label, bitwise, _ in pools(P).run(xw.rhd_theorem, 4099, "float64"):
        # over two virtual ranks (P < 4) doubling combines in halving's order too
        assert label == "rhd (halving)" or P < 4
        assert bitwise
