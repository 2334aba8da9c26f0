"""Trials (shmcoll.tuning.trials): the cost model's close calls settled by measurement
on the first blocking calls of a size class, the same winner on every rank."""
import statistics

import pytest

import trial_workers as tw
from shmcoll._core.topology import job_cpus
from shmcoll.tuning import trials
from shmcoll.tuning.selector import Candidate


def table(**seconds):
    return {a: Candidate(a, a, i, s) for i, (a, s) in enumerate(seconds.items())}


def test_candidates_are_the_choice_and_those_priced_close_to_it():
    assert trials.candidates(table(ring=1.0, direct=1.2, tree=1.6, rhd=1.4), "ring") == \
        ["ring", "direct", "rhd"]
    assert trials.candidates(table(ring=1.0, direct=2.0), "ring") == []     # no close call
    assert trials.candidates(table(ring=1.0, direct=1.1), "tree") == []     # a rule chose


def test_a_candidate_the_model_cannot_pin_down_is_tried_by_its_least_price():
    """cma's price for bytes unchanged since its last read (Candidate.least) puts it
    on trial within UNSURE_MARGIN of the cheapest, besides the closest three."""
    unsure = trials.UNSURE_MARGIN * 0.9
    t = table(ring=1.0, direct=1.1, rhd=1.2, tree=1.3)
    t["cma"] = Candidate("cma", "cma", 9, 3.0, least=unsure)
    assert trials.candidates(t, "ring") == ["ring", "direct", "rhd", "cma"]
    t["cma"] = Candidate("cma", "cma", 9, 3.0, least=trials.UNSURE_MARGIN * 1.1)
    assert trials.candidates(t, "ring") == ["ring", "direct", "rhd"]
    # alone beside the choice it still makes a trial; without a least price, 3.0 does not
    assert trials.candidates({"ring": t["ring"], "cma": Candidate("cma", "cma", 9, 3.0, unsure)},
                             "ring") == ["ring", "cma"]
    assert trials.candidates(table(ring=1.0, cma=3.0), "ring") == []


def test_a_trial_runs_each_candidate_in_turn_and_the_fastest_wins():
    t = trials.Trial(["ring", "direct"])
    runs = []
    while not t.measured:
        runs.append(t.current)
        first = t.calls % trials.BLOCK == 0
        t.observe({"ring": 2.0, "direct": 1.0}[t.current] + (5.0 if first else 0.0) + t.calls)
    assert runs == (["ring"] * trials.BLOCK + ["direct"] * trials.BLOCK) * trials.PASSES
    # the first call of each run is not timed; the median of the others counts
    timed = [[2.0 + c for c in range(len(runs)) if runs[c] == name and c % trials.BLOCK]
             for name in ("ring", "direct")]
    timed[1] = [t - 1.0 for t in timed[1]]
    assert t.medians() == [statistics.median(x) for x in timed]
    assert t.settle([2.5, 1.5]) == "direct"


def test_the_models_choice_stays_unless_another_is_clearly_faster():
    """Within CHALLENGE of the fastest, the model's choice wins its trial (a trial's
    cold, alternating calls bring the candidates' times together)."""
    close = 1 + trials.CHALLENGE * 0.9
    assert trials.Trial(["direct", "rhd", "ring"], "direct").settle([close, 1.0, 1.5]) == "direct"
    far = 1 + trials.CHALLENGE * 1.1
    assert trials.Trial(["direct", "rhd", "ring"], "direct").settle([far, 1.0, 1.5]) == "rhd"
    assert trials.Trial(["direct", "rhd"]).settle([close, 1.0]) == "rhd"     # no favourite


def test_calls_left_count_down_to_the_call_that_settles():
    t = trials.Trial(["ring", "direct", "rhd"])
    total = 3 * trials.BLOCK * trials.PASSES
    assert t.calls_left == total + 1
    while not t.measured:
        t.observe(1.0)
    assert t.calls_left == 1            # the next call agrees on the winner
    t.settle([2.0, 1.0, 3.0])
    assert t.calls_left == 0


def test_a_benchmark_knows_how_many_calls_auto_still_tries(pools):
    """Communicator.calls_until_settled: one less after each call, 0 once the winner
    serves the size (where trials run at all; 0 throughout where they do not)."""
    for counts in pools(2).run(tw.count_down):
        for n, left in counts.items():
            assert left == list(range(left[0], -1, -1)), (n, left)
        if 2 <= job_cpus():
            assert any(left[0] > 0 for left in counts.values()), counts


@pytest.mark.parametrize("P", [2, 3])
def test_every_rank_settles_on_the_same_schedule(pools, P):
    """Trials where every rank has a CPU of its own; the model alone where ranks
    outnumber them (a call's time there follows the scheduler)."""
    results = pools(P).run(tw.settle)
    assert all(r == results[0] for r in results), results
    assert results[0]["tried"] == (P <= job_cpus())


@pytest.mark.parametrize("P", [2, 3])
def test_calls_on_symmetric_arrays_settle_their_trials_too(pools, P):
    """The symmetric path's decider tries its close calls like the regular one (its
    single-copy schedules among them), with right results throughout; where ranks
    outnumber the CPUs, the model's choice alone."""
    results = pools(P).run(tw.symmetric_settle)
    assert all(r == results[0] for r in results), results
    for coll, (start, left, winner) in results[0].items():
        assert left == 0 and winner, (coll, start, left, winner)
    if P <= job_cpus():
        assert any(start > 0 for start, _, _ in results[0].values()), results[0]


def test_calls_carried_in_the_records_are_never_tried(pools):
    """Inline does a part of what every other schedule does: no trial of it (one
    could only take noise for a difference)."""
    for per_rank in pools(2).run(tw.inline_untried):
        for coll, n, left, label in per_rank:
            assert left == 0 and label == "direct (inline)", (coll, n, left, label)


def test_nonblocking_calls_meanwhile_run_the_models_choice(pools):
    for wrong, label in pools(3).run(tw.mixed_with_nonblocking):
        assert wrong == 0 and label


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_no_trial_when_turned_off_or_an_algorithm_is_named(pools, mode):
    for started, models_choice in pools(2).run(tw.untried, mode):
        assert all(t is None or t.calls == 0 for t in started.values()), started
        assert models_choice


def test_a_named_algorithm_is_remembered_apart_from_auto():
    """The engine looks a call's schedule up in Decider.codes: auto's by size, a named
    algorithm's in a table of its own, so neither takes the other's."""
    from shmcoll import _engine
    from shmcoll.tuning import calibration
    from shmcoll.tuning.decider import Decider
    d = Decider(2, calibration.model_for(2)[0])
    auto = d.code("allreduce", 4096, None)
    ring = d.code("allreduce", 4096, "ring")
    memo = d.codes[_engine.COLLECTIVE_CODES["allreduce"]]
    assert ring == _engine.SCHEDULE_CODES["ring"] != auto
    assert memo[4096] == auto and memo["ring"] == {4096: ring}

