"""Nonblocking collectives (async_op=True): every collective and algorithm against the
numpy reference with many calls outstanding, ordering, blocking calls mixed in, and
every way a work can fail (mismatch, a peer killed for real, timeouts, close, exit
without waiting, fork)."""
import re
import secrets
import signal
import time

import numpy as np
import pytest

import nonblocking_workers as nb
import shmcoll
from procs import cleaned_up, rank_env, spawn
from reference import assert_cases_match, case_grid
from shmcoll._core import segment
from test_collectives import LONG, algos, roots
from shmcoll.collectives import ROOTED


def async_cases(P):
    """Every collective x algorithm x root, in place and not, a few dtypes and ops,
    small and multi-chunk sizes, and the zero-size call."""
    return case_grid(P, (("float32", "sum"), ("int16", "max"), ("float16", "avg"),
                         ("uint8", "bxor")), [(0,), (5,), (LONG,)], 3, algos,
                     lambda coll: roots(P) if coll in ROOTED else [0])


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_collective_and_algorithm_async_against_numpy(pools, P):
    cases = async_cases(P)
    assert_cases_match(cases, pools(P).run(nb.run_cases_async, cases), P)


@pytest.mark.parametrize("P", [2, 3])
def test_blocking_calls_mixed_with_async_ones_keep_the_order(pools, P):
    cases = async_cases(P)
    got = pools(P).run(nb.run_cases_async, cases, 16, 5)
    assert_cases_match(cases, got, P)


def test_many_outstanding_complete_in_issue_order(pools):
    P, n = 3, 64
    for values, last, completed in pools(P).run(nb.ordered_values, n):
        assert values == [sum(r * 1000 + i for r in range(P)) for i in range(n)]
        assert last == [sum(range(P))] * 3
        assert all(completed), "a blocking call returned before the works issued first"


def test_wait_all_returns_results_in_order(pools):
    for got in pools(2).run(nb.wait_all_results):
        assert got == [2 * i for i in range(6)] + [None]


def test_bad_arguments_raise_at_issue_and_queue_nothing(pools):
    for kinds, good, outstanding in pools(2).run(nb.errors_at_issue):
        assert kinds == ["ValueError", "ValueError", "ValueError", "ValueError", "ValueError"]
        assert good == [2.0] * 3 and outstanding == 0


def test_a_mismatch_fails_the_work_and_everything_queued_behind_it():
    for outcomes, errors, barrier in shmcoll.launch(nb.mismatch_then_more, 2):
        assert [o[0] for o in outcomes] == ["MismatchError"] * 3, outcomes
        assert outcomes[0][1] == "count" and "different calls" in outcomes[0][2]
        assert all("was not run" in o[2] for o in outcomes[1:])
        assert errors == ["MismatchError"] * 3
        assert barrier[0] == "CommunicatorBrokenError" and "MismatchError" in barrier[2]


def test_wait_timeout_leaves_the_work_outstanding_then_the_call_times_out(monkeypatch):
    monkeypatch.setenv("SHMCOLL_TIMEOUT", "1")
    short, running, final, done, kind = shmcoll.launch(nb.timeout_in_wait, 2)[0]
    assert short[0] == "TimeoutError" and "stays outstanding" in short[2]
    assert running == (False, None)
    assert final[0] == "TimeoutError" and "never reached this call" in final[2]
    assert done and kind == "TimeoutError"


@pytest.mark.parametrize("P", [2, 3])
def test_close_waits_for_outstanding_works(P):
    for closed, values, completed in shmcoll.launch(nb.close_with_outstanding, P, args=(9,)):
        assert closed and all(completed)
        assert values == [P * i + sum(range(P)) for i in range(9)]


def test_a_failing_rank_fails_its_queued_works_at_once(tmp_path):
    flag = str(tmp_path / "failed")
    (kinds, closed), peer = shmcoll.launch(nb.fail_with_outstanding, 2, args=(flag,))
    assert kinds == ["ClosedError"] * 3 and closed
    assert peer == "PeerLostError"


def test_progress_needs_no_help_from_the_caller(tmp_path):
    (seen, correct), peer_correct = shmcoll.launch(
        nb.progress_while_computing, 2, args=(str(tmp_path / "done"),))
    assert seen, "the peer's allreduce did not finish while rank 0 computed"
    assert correct and peer_correct


def test_async_call_while_another_thread_is_in_a_blocking_one(tmp_path):
    (refused, inside), _ = shmcoll.launch(nb.submit_while_blocking_elsewhere, 2,
                                          args=(str(tmp_path / "go"),))
    assert refused == "ConcurrentCallError"
    assert inside[0] == "ok" and np.array_equal(inside[1], np.full(8, 2, np.float32))


def test_a_forked_child_fails_the_copies_of_queued_works(pools):
    for in_child, values in pools(2).run(nb.fork_with_outstanding):
        assert set(in_child) <= {"ClosedError", "done"}, in_child
        assert values == [2.0] * 4


def _start(mode, count, rank, world, job):
    return spawn("async_rank.py", mode, str(count), **rank_env(job, rank, world))


@pytest.mark.parametrize("mode", ["loop", "loop-receiving"])
@pytest.mark.parametrize("count", [2, 1 << 20], ids=["8B", "4MiB"])
def test_a_killed_peer_fails_every_outstanding_work(count, mode):
    """Also a receive from the killed rank pending meanwhile, on the queue of messages."""
    job = "async-death-" + secrets.token_hex(4)
    procs = [_start(mode, count, r, 3, job) for r in range(3)]
    with cleaned_up(procs):
        for p in procs:
            assert p.stdout.readline().strip() == "looping"
        time.sleep(0.3)
        procs[2].send_signal(signal.SIGKILL)
        for p in procs[:2]:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 3, err
            m = re.search(r"lost rank (\d+); outstanding: ([\w ()]+); ranks \[(\d*)\]", out)
            assert m and m.group(1) == "2", out
            message = ["PeerLostError(2)"] if mode == "loop-receiving" else []
            assert m.group(2).split() == ["PeerLostError"] * 3 + message, out
            assert m.group(3) == "2", out


def test_a_rank_exiting_without_waiting_completes_its_works_first():
    job = "async-exit-" + secrets.token_hex(4)
    procs = [_start("exit", 1 << 18, r, 3, job) for r in range(3)]
    name, _ = segment.job_identity(job, None)
    with cleaned_up(procs, [name]):
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        assert [o[0].strip() for o in outs[1:]] == ["correct", "correct"], outs
        assert not any("Traceback" in err or "Fatal" in err for _, err in outs), outs
        assert segment.open_existing(name) is None


def test_two_threads_race_to_issue_and_wait_for_each_others_works():
    for values in shmcoll.launch(nb.two_threads_issue_and_wait, 3, args=(40,)):
        assert values == [3.0] * 80


def test_a_signal_handler_that_raises_ends_wait_but_not_the_call(tmp_path):
    (interrupted, still_running, result), peer = shmcoll.launch(
        nb.signal_during_wait, 2, args=(str(tmp_path / "go"),))
    assert interrupted == "_Alarm" and still_running
    assert result == peer == [2.0] * 8
