"""Single copy of ordinary arrays with cross-memory attach (algorithm "cma"): the
probe at creation and the ranks' agreement on it, every collective, dtype and op
against numpy, in place and views, the reuse rule under an uneven schedule,
nonblocking calls, and what a disagreement gets."""
import platform

import numpy as np
import pytest

import cma_workers as cw
from symmetric_workers import rank_values
from test_symmetric import CASES, check_all


@pytest.fixture(scope="module")
def cma_pools(pools):
    """pools, once the ranks are known to reach each other's memory."""
    agreed = pools(2).run(cw.agreement)
    if agreed[0] is None:
        pytest.skip("process_vm_readv is not permitted between the ranks here "
                    "(kernel.yama.ptrace_scope > 0, a seccomp filter, or SHMCOLL_CMA=off)")
    return pools


def test_every_rank_agrees_on_what_it_measured(cma_pools):
    for P in (2, 3):
        agreed = cma_pools(P).run(cw.agreement)
        assert len(set(agreed)) == 1, agreed
        per_read, ratio, unchanged, write = agreed[0]
        assert 0 < per_read < 1e-3 and ratio > 0 and unchanged > 0 and write > 0


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("dtype,op", CASES)
def test_cma_collectives_against_numpy(cma_pools, P, dtype, op):
    check_all(cma_pools(P).run(cw.every_collective, dtype, op), P, dtype, op)


def test_both_allreduce_variants_run(cma_pools):
    """The sizes above take one-shot and two-shot alike."""
    taken = cma_pools(2).run(cw.variants_taken, "float32")[0]
    assert taken == {"cma (one-shot)", "cma (two-shot)"}, taken


@pytest.mark.parametrize("P", [2, 4])
def test_a_rank_may_write_its_array_as_soon_as_the_call_returned(cma_pools, P):
    assert cma_pools(P).run(cw.reuse_at_once, 200) == [0] * P


@pytest.mark.parametrize("P", [2, 3, 4])
def test_two_shot_pushes_blocks_of_several_chunks(cma_pools, P):
    """Blocks of 3.4 chunks (256 KiB each) and an uneven last block: every chunk
    reduced and pushed into every peer, in place too, whoever is late."""
    n = P * 3 * (1 << 16) * 9 // 8 + P - 1
    for taken, wrong in cma_pools(P).run(cw.two_shot_in_chunks, n, 4):
        assert taken == {"cma (two-shot)"} and wrong == 0


def test_nonblocking_cma(cma_pools):
    P = 3
    want = sum(rank_values(q, 70001, np.float32) for q in range(P))
    rows = np.stack([rank_values(q, 999, np.float32) for q in range(P)])
    for got, gathered in cma_pools(P).run(cw.nonblocking):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(gathered, rows)


@pytest.mark.parametrize("how", ["off", "not dumpable", "writes denied"])
def test_a_rank_that_declines_or_cannot_be_read_turns_it_off_for_all(cma_pools, how):
    if how == "not dumpable" and platform.machine() not in cw.SYSCALLS:
        pytest.skip(f"capget/capset numbers of {platform.machine()} not known here")
    if how == "writes denied" and platform.machine() not in cw.WRITEV:
        pytest.skip(f"seccomp numbers of {platform.machine()} not known here")
    outcomes = cw.launch(cw.declines, 3, how)
    if how == "not dumpable" and outcomes[0][0] is not None:
        pytest.skip("this user may read non-dumpable processes (CAP_SYS_PTRACE)")
    for agreed, refused, total in outcomes:
        assert agreed is None
        assert refused and "cross-memory attach" in refused, refused
        assert total == 3.0


def test_ranks_that_disagree_on_cma_raise_mismatch_everywhere(cma_pools):
    for text in cw.launch(cw.mismatched, 2):
        assert text.startswith("MismatchError") and "algorithm" in text, text
