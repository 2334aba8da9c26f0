"""Cost formulas against hand-computed values; selection, overrides, the debug log."""
import dataclasses
import logging
import math

import pytest

from shmcoll import _engine
from shmcoll.tuning import calibration
from shmcoll.tuning import selector
from shmcoll.tuning.algorithms import REGISTRY, direct, naive, rhd, ring, tree
from shmcoll.tuning.algorithms.terms import CostModel, Models, Terms, model_for_collective

# α = 1 µs per step, o = 0, β = 1 ns/B, γ = 0.5 ns/B: the textbook formulas.
M = CostModel(alpha=1e-6, overhead=0.0, beta=1e-9, gamma=0.5e-9)


def seconds(alg, collective, P, n, model=M):
    return {v: model.seconds(t) for v, _, t in alg.variants(collective, P, n)}


def test_ring_allreduce_matches_patarasuk_yuan():
    # 2(P-1)α + 2n(P-1)/P β + n(P-1)/P γ with P=4, n=1 MB; β prices bytes copied, and
    # each byte sent is copied twice (into the slot, out of it): 4n(P-1)/P
    want = 6e-6 + 4 * 1e6 * 0.75 * 1e-9 + 1e6 * 0.75 * 0.5e-9
    assert seconds(ring, "allreduce", 4, 1e6)["ring"] == pytest.approx(want)


def test_ring_reduce_scatter_allgather_broadcast_reduce():
    assert seconds(ring, "reduce_scatter", 8, 8e6)["ring"] == pytest.approx(7e-6 + 7e6 * 2.5e-9)
    assert seconds(ring, "allgather", 2, 2e3)["ring"] == pytest.approx(1e-6 + 2e3 * 1e-9)
    # a middle rank of the chain copies n in and n out; with P = 2 there is none
    assert seconds(ring, "broadcast", 5, 1e6)["chain"] == pytest.approx(4e-6 + 2e6 * 1e-9)
    assert seconds(ring, "broadcast", 2, 1e6)["chain"] == pytest.approx(1e-6 + 1e6 * 1e-9)
    assert seconds(ring, "reduce", 5, 1e6)["chain"] == pytest.approx(4e-6 + 2e6 * 1e-9 + 0.5e-3)


def test_binomial_tree_allreduce_matches_the_issue_formula():
    # 2⌈log2 P⌉α + 2n⌈log2 P⌉β + n⌈log2 P⌉γ: P=5 -> L=3
    n = 4096
    want = 6e-6 + 2 * n * 3 * 1e-9 + n * 3 * 0.5e-9
    assert seconds(tree, "allreduce", 5, n)["binomial"] == pytest.approx(want)
    assert seconds(tree, "broadcast", 8, n)["binomial"] == pytest.approx(3e-6 + 3 * n * 1e-9)
    assert seconds(tree, "gather", 8, 8000)["binomial"] == pytest.approx(3e-6 + 7000e-9)
    assert seconds(tree, "reduce", 2, 100)["binomial"] == pytest.approx(1e-6 + 100e-9 + 50e-9)


def test_direct_one_shot_and_two_shot():
    # what every peer gets alike is written once (fan-out): one-shot copies n in and
    # 3n out, two-shot 3 blocks in and 3 out for its ReduceScatter, 1 in and 3 out after
    s = seconds(direct, "allreduce", 4, 1e3)
    assert s["one-shot"] == pytest.approx(1e-6 + 4e3 * 1e-9 + 3e3 * 0.5e-9)
    assert s["two-shot"] == pytest.approx(2e-6 + 2.5e3 * 1e-9 + 750 * 0.5e-9)
    assert seconds(direct, "allgather", 4, 4e3)["direct"] == pytest.approx(1e-6 + 4e3 * 1e-9)
    two = seconds(direct, "allreduce", 2, 1e3)     # one peer: as without fan-out
    assert two["one-shot"] == pytest.approx(1e-6 + 2e3 * 1e-9 + 1e3 * 0.5e-9)
    # the root writes each chunk once for all peers, each peer copies it out once
    assert seconds(direct, "broadcast", 4, 1e3)["star"] == pytest.approx(1e-6 + 1e-6)
    assert seconds(direct, "scatter", 4, 4e3)["star"] == pytest.approx(1e-6 + 3e-6)


def test_rhd_power_of_two_and_folded():
    n = 1 << 20
    s = seconds(rhd, "allreduce", 8, n)
    assert s["doubling"] == pytest.approx(3e-6 + 3 * n * 2.5e-9)
    assert s["halving"] == pytest.approx(6e-6 + 4 * n * 7 / 8 * 1e-9 + n * 7 / 8 * 0.5e-9)
    # P = 6 folds 2 extra ranks onto p2 = 4: + 2α + 2nβ + nγ
    folded = seconds(rhd, "allreduce", 6, n)["halving"]
    assert folded == pytest.approx(4e-6 + 4 * n * 0.75e-9 + n * 0.75 * 0.5e-9
                                   + 2e-6 + 2 * n * 1e-9 + n * 0.5e-9)


def test_naive_is_reduce_then_broadcast_through_rank_0():
    assert seconds(naive, "allreduce", 3, 1e3)["naive"] == pytest.approx(
        2e-6 + 2 * 2e3 * 1e-9 + 2e3 * 0.5e-9)


def test_setup_is_a_per_call_cost_of_one_algorithm():
    m = CostModel(alpha=0, overhead=0, beta=0, gamma=0, setup=(("tree", 2e-6),))
    assert m.seconds(Terms(steps=3), "tree") == pytest.approx(2e-6)
    assert m.seconds(Terms(steps=3), "ring") == 0.0
    assert selector.cost_table("broadcast", 4, 8, m)["tree"].seconds == pytest.approx(2e-6)


def test_overhead_prices_messages_not_steps():
    one = CostModel(alpha=0, overhead=1e-6, beta=0, gamma=0)
    assert one.seconds(Terms(steps=5, messages=3)) == pytest.approx(3e-6)
    s = seconds(direct, "allreduce", 4, 1 << 16, one)     # (past eager, which sends none)
    assert s == {"one-shot": pytest.approx(3e-6), "two-shot": pytest.approx(6e-6)}


def test_seed_crossover_tree_vs_ring_at_p16():
    """The seed: P = 16, α = 1 µs, β = 1 ns/B puts the tree/ring crossover below αP/β
    = 16 KB: here 2·4α + 8nβ = 30α + 4n(15/16)β, n* = 22α / ((8 - 15/4)β) ≈ 5.2 KB."""
    m = CostModel(alpha=1e-6, overhead=0, beta=1e-9, gamma=0)
    table = lambda n: {k: c.seconds for k, c in selector.cost_table("allreduce", 16, n, m).items()}
    crossover = 22e-6 / ((8 - 15 / 4) * 1e-9)
    assert table(crossover * 0.99)["tree"] < table(crossover * 0.99)["ring"]
    assert table(crossover * 1.01)["tree"] > table(crossover * 1.01)["ring"]
    assert 16e3 / 4 < crossover < 16e3


def test_every_registered_algorithm_prices_every_collective_it_claims():
    for name, alg in REGISTRY.items():
        for coll in alg.COLLECTIVES:
            for P in (1, 2, 3, 8, 13):
                for variant, code, terms in alg.variants(coll, P, 1000):
                    assert M.seconds(terms) >= 0 and isinstance(code, int), (name, coll, P)


def test_choose_with_hand_made_calibrations():
    latency_bound = CostModel(alpha=100e-6, overhead=0, beta=1e-12, gamma=1e-12)
    bandwidth_bound = CostModel(alpha=1e-12, overhead=0, beta=1e-9, gamma=1e-9)
    assert selector.choose("allreduce", 4, 1 << 20, model=latency_bound) == "direct"
    assert selector.choose("allreduce", 8, 1 << 20, model=bandwidth_bound) in ("ring", "rhd", "direct")
    assert selector.code("allreduce", 8, 1 << 20, model=bandwidth_bound) in (0, 2, 5)
    assert selector.choose("broadcast", 8, 64, model=latency_bound) == "direct"
    # fanned out, the star moves n through its busiest rank where the chain moves 2n
    assert selector.choose("broadcast", 8, 1 << 26, model=bandwidth_bound) == "direct"
    # no per-step cost, expensive messages: fewer messages win (past eager, which
    # sends none but is priced at the least synchronisation of the others)
    msg_bound = CostModel(alpha=0, overhead=1e-3, beta=0, gamma=0)
    assert selector.choose("broadcast", 8, 1 << 16, model=msg_bound) == "ring"
    assert selector.code("broadcast", 8, 64, model=msg_bound) == direct.CODE_EAGER


def test_explicit_algo_wins_and_unknown_names_fail():
    assert selector.choose("allreduce", 4, 1 << 20, "tree") == "tree"
    assert selector.choose("allreduce", 4, 8, "auto") == selector.choose("allreduce", 4, 8)
    with pytest.raises(ValueError, match="unknown algorithm 'rhd' for broadcast"):
        selector.choose("broadcast", 4, 8, "rhd")
    with pytest.raises(ValueError, match="unknown algorithm 'butterfly'"):
        selector.choose("allreduce", 4, 8, "butterfly")


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_calls_that_fit_the_call_records_run_inline(P):
    """Inline does a part of what every other schedule does (each publishes its call and
    checks every peer's), so the reference model picks it wherever every rank's part
    fits in its record, whatever each collective's fit put its fixed costs into."""
    model = calibration.model_for(P)[0]
    for coll in direct.INLINE_COLLECTIVES:
        per_rank = P if coll in ("allgather", "gather") else 1
        for part in (0, 8, _engine.INLINE_BYTES):
            decision = selector.decide(coll, P, part * per_rank, model=model)
            assert decision.candidate.label == "direct (inline)", (coll, part, decision)
            others = [c.seconds for c in decision.table.values() if c.algorithm != "direct"]
            assert decision.candidate.seconds <= min(others) * (1 + 1e-9)
        past = selector.decide(coll, P, (_engine.INLINE_BYTES + 1) * per_rank, model=model)
        assert past.table["direct"].variant != "inline"


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_eager_calls_are_never_priced_above_the_channel_schedules_they_replace(P):
    """Eager moves what one-shot or the star moves, with the records' synchronisation
    alone: `direct` stands for it from one byte past the records up to EAGER_BYTES
    per rank (AllReduce may take two-shot where it moves fewer bytes), not past that."""
    model = calibration.model_for(P)[0]
    for coll in direct.INLINE_COLLECTIVES:
        per_rank = P if coll in ("allgather", "gather") else 1
        for part in (_engine.INLINE_BYTES + 1, 4096, _engine.EAGER_BYTES):
            table = selector.cost_table(coll, P, part * per_rank, model=model)
            channel = min(model_for_collective(model, coll).seconds(t, "direct")
                          for v, _, t in direct.variants(coll, P, part * per_rank)
                          if v not in direct.WITH_THE_RECORDS)
            assert table["direct"].seconds <= channel * (1 + 1e-9), (coll, part)
            assert table["direct"].variant == "eager" or \
                (coll == "allreduce" and table["direct"].variant == "two-shot"), (coll, part)
        past = selector.cost_table(coll, P, (_engine.EAGER_BYTES + 1) * per_rank, model=model)
        assert past["direct"].variant not in direct.WITH_THE_RECORDS, coll


def test_eager_copies_are_priced_at_the_least_bandwidth_cost_of_the_call():
    """At P = 2 the chain is the star, and eager is the star with one synchronisation
    less; the reference fits give the ring a lower β than direct, which priced the
    chain under eager for Broadcast (in bench/selector_accuracy.py runs on a 2-core EPYC,
    eager took 0.7-0.95x the chain's time at 256 B-16 KiB)."""
    model = calibration.model_for(2)[0]
    for n in (64, 4096, 16384):
        assert selector.decide("broadcast", 2, n, model=model).candidate.label == "direct (eager)"


def test_a_fixed_algorithm_still_picks_its_variant_by_size():
    assert selector.code("allreduce", 4, 8, "direct", model=M) == direct.CODE_INLINE
    assert selector.code("allreduce", 4, 49, "direct", model=M) == direct.CODE_EAGER
    assert selector.code("allreduce", 2, _engine.EAGER_BYTES + 1, "direct", model=M) == \
        direct.CODE_TWO_SHOT     # (it reduces half of one-shot's bytes)
    assert selector.code("allreduce", 4, 64 << 20, "direct", model=M) == direct.CODE_TWO_SHOT
    assert selector.code("allreduce", 8, 8, "rhd", model=M) == rhd.CODE_DOUBLING
    assert selector.code("allreduce", 8, 64 << 20, "rhd", model=M) == rhd.CODE_HALVING


# -- the override grammar -----------------------------------------------------------

def test_grammar_per_collective_ranges():
    rules = selector.parse_overrides("allreduce:tree@0-64K,ring;broadcast:tree")
    assert rules.lookup("allreduce", 0) == "tree"
    assert rules.lookup("allreduce", 64 << 10) == "tree"          # inclusive
    assert rules.lookup("allreduce", (64 << 10) + 1) == "ring"
    assert rules.lookup("broadcast", 1 << 30) == "tree"
    assert rules.lookup("gather", 8) is None                     # not covered: cost model
    d = selector.decide("allreduce", 4, 100, rules=rules, model=M)
    assert (d.candidate.algorithm, d.reason) == ("tree", "SHMCOLL_ALGO")
    d = selector.decide("allreduce", 4, 100, "direct", rules=rules, model=M)
    assert (d.candidate.algorithm, d.reason) == ("direct", "algo=")


def test_grammar_plain_entries_and_precedence():
    rules = selector.parse_overrides("ring; allreduce:direct@1M-")
    assert rules.lookup("allreduce", 2 << 20) == "direct"
    assert rules.lookup("allreduce", 8) == "ring"              # the plain entry
    assert rules.lookup("broadcast", 8) == "ring"
    assert rules.lookup("gather", 8) is None                   # ring has no gather
    assert selector.parse_overrides("tree@4K").lookup("reduce", 4096) == "tree"
    assert selector.parse_overrides("tree@4K").lookup("reduce", 4097) is None
    assert selector.parse_overrides("") == () and selector.parse_overrides(None) == ()


@pytest.mark.parametrize("bad, why", [
    ("butterfly", "unknown algorithm 'butterfly'"),
    ("allreduce:tree@x-", "invalid size"),
    ("allreduce:tree@64K-1K", "empty size range"),
    ("bcast:ring", "unknown collective 'bcast'"),
    ("reduce_scatter:tree", "tree does not implement reduce_scatter"),
    ("allreduce:", "no algorithm"),
    ("gather:rhd@0-8", "rhd does not implement gather"),
])
def test_grammar_errors_name_the_problem(bad, why):
    with pytest.raises(ValueError, match="SHMCOLL_ALGO") as e:
        selector.parse_overrides(bad)
    assert why in str(e.value)


def test_defaults_written_in_the_grammar_round_trip():
    text = str(selector.describe(4, M))
    rules = selector.parse_overrides(text)
    assert format(rules) == text
    for coll in selector.ALL_COLLECTIVES:
        for n in [0, 1, 100, 4096, 5000, 1 << 16, 1 << 20, 3 << 22, 1 << 30]:
            assert rules.lookup(coll, n) == selector.choose(coll, 4, n, model=M), (coll, n, text)


def test_describe_finds_the_exact_crossover():
    rules = selector.describe(4, M, collectives=("reduce",))
    assert len(rules) >= 2
    for rule in rules[:-1]:
        before = selector.choose("reduce", 4, rule.hi, model=M)
        assert before == rule.algorithm != selector.choose("reduce", 4, rule.hi + 1, model=M)


def test_debug_log_lists_every_candidate(caplog):
    d = selector.decide("allreduce", 4, 4096, model=M)
    with caplog.at_level(logging.INFO, logger="shmcoll"):
        selector.log_decision(0, "allreduce", 4, 4096, d)
        selector.log_decision(0, "allreduce", 4, 4096, d)     # once per key
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    for name in ("ring", "direct", "tree", "rhd", "naive"):
        assert name in lines[0]
    assert "allreduce 4096 B P=4" in lines[0] and "cost model" in lines[0]


# -- calibration file -----------------------------------------------------------------

def test_calibration_round_trip_is_keyed_by_world(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    monkeypatch.setenv("SHMCOLL_CALIBRATION", str(path))
    model = CostModel(alpha=3e-6, overhead=1e-7, beta=2e-10, gamma=1e-10, setup=(("tree", 1e-6),))
    calibration.save(3, {"broadcast": (model, 0.1)}, {"measurements": 10})
    got, source = calibration.model_for(3)
    assert got.for_collective("broadcast") == model and source.startswith("calibrated")
    assert got.for_collective("gather") == calibration.default_model(3).default
    other, source = calibration.model_for(4)
    assert source == "default" and other == calibration.default_model(4)
    monkeypatch.setenv("SHMCOLL_CALIBRATION", "off")
    assert calibration.model_for(3)[1] == "default"


def test_corrupt_calibration_file_falls_back_to_defaults(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    path.write_text("{not json")
    monkeypatch.setenv("SHMCOLL_CALIBRATION", str(path))
    assert calibration.model_for(2)[1] == "default"
    assert not math.isnan(calibration.model_for(2)[0].for_collective("allreduce").alpha)


def test_models_price_each_collective_with_its_own_parameters():
    cheap_steps = CostModel(alpha=0, overhead=0, beta=1e-9, gamma=0)
    dear_steps = CostModel(alpha=1e-3, overhead=0, beta=1e-9, gamma=0)
    models = Models(dear_steps, (("broadcast", cheap_steps),))
    assert selector.cost_table("broadcast", 4, 8, models)["ring"].seconds < 1e-6
    assert selector.cost_table("allreduce", 4, 8, models)["ring"].seconds > 1e-3


def test_a_bound_rank_decides_like_its_unbound_peers():
    """Binding narrows a rank's affinity mask; the model it picks must not change,
    or ranks would choose different algorithms."""
    import os
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity control here")
    before = os.sched_getaffinity(0)
    unbound = (calibration.model_for(2), calibration.machine_key())
    try:
        os.sched_setaffinity(0, {min(before)})
        assert (calibration.model_for(2), calibration.machine_key()) == unbound
    finally:
        os.sched_setaffinity(0, before)


def test_cgroup_limits_are_read_from_cpuset_and_quota(tmp_path):
    from shmcoll._core.topology import cgroup_cpus as _cgroup_cpus
    (tmp_path / "cpuset.cpus.effective").write_text("0-3,8,10-11\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_cpus(str(tmp_path)) == 7
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert _cgroup_cpus(str(tmp_path)) == 3
    assert _cgroup_cpus(str(tmp_path / "missing")) is None


def test_cma_is_the_symmetric_schedule_with_its_reads_priced_by_the_measured_ratio():
    """symmetric terms with the bytes read at 2ρ (times the ranks reading the same pages
    at once) and the bytes written at 2ω, priced by the collective's own fit, plus σ per
    system call (tuning.algorithms.cma); the least price the same with ρ of unchanged
    bytes."""
    from shmcoll.tuning.algorithms import cma, symmetric
    n, P, per_read, ratio, unchanged, write = 1 << 20, 4, 2e-6, 0.4, 0.1, 0.3
    models = Models(M, cross_memory=(per_read, ratio, unchanged, write))
    written = {"one-shot": 0.0, "two-shot": n * (P - 1) / P}
    sharers = {"one-shot": P - 1, "two-shot": 1}
    # two-shot pushes each reduced chunk as it makes it: no middle barrier, and per
    # 256 KiB of its block P-1 reads and P-1 writes
    barriers = {"one-shot": 0, "two-shot": 1}
    calls = {"one-shot": (P - 1) * (1 + n / cma.CHUNK), "two-shot": 2 * (P - 1) * n / P / cma.CHUNK}
    for (variant, code, t), (sym_variant, _, s) in zip(cma.variants("allreduce", P, n),
                                                       symmetric.variants("allreduce", P, n)):
        assert variant == sym_variant and code in (cma.CODE, cma.CODE_TWO_SHOT)
        assert t.written == written[variant] and t.sharers == sharers[variant]
        assert (t.steps, t.messages) == (s.steps - barriers[variant],
                                         s.messages - barriers[variant] * (P - 1))
        assert t.reads == pytest.approx(calls[variant])
        for rho, price in ((ratio, cma.price), (unchanged, cma.least_price)):
            copies = (s.moved - t.written) * 2 * rho * t.sharers + t.written * 2 * write
            read = Terms(t.steps, t.messages, copies, s.reduced)
            want = symmetric.price(models, "allreduce", read, variant, fit=None) + per_read * t.reads
            if price is cma.price:      # fresh bytes: never below the symmetric schedule
                want = max(want, symmetric.price(models, "allreduce", t, variant) +
                           per_read * t.reads)
            assert price(models, "allreduce", t, variant) == pytest.approx(want)
        # fresh bytes: never below the symmetric schedule (pointer loads, no syscall)
        cheap = Models(M, cross_memory=(per_read, 0.01, 0.01, 0.01))
        floor = symmetric.price(cheap, "allreduce", t, variant) + per_read * t.reads
        assert cma.price(cheap, "allreduce", t, variant) == pytest.approx(floor)
        assert cma.least_price(cheap, "allreduce", t, variant) < floor
    (_, _, t), = cma.variants("broadcast", P, n)
    assert t.reads == P - 1      # the root pushes the head of every receiver's copy
    assert t.moved == n * (P - 1) / P and t.written == 0 and t.sharers == P - 1
    (_, _, t), = cma.variants("allgather", P, n)
    assert t.reads == P - 1 and t.moved == t.written == n * (P - 1) / P and t.sharers == 1
    (_, _, t), = cma.variants("gather", P, n)
    assert t.reads == 1 and t.moved == t.written == n / P    # every rank pushes its own row
    (_, _, t), = cma.variants("reduce", P, n)    # every rank reduces and writes a block
    assert t.moved == n and t.reduced == n * (P - 1) / P and t.written == n / P
    assert t.reads == P * max(1, n / P / cma.CHUNK)     # P-1 reads and a write per chunk


def test_cma_writes_are_priced_by_the_write_ratio_and_shared_reads_by_their_readers():
    """Pushed bytes cost ω, not ρ: a cheaper write makes AllGather (all pushes) cheaper
    and leaves ReduceScatter (all reads) as it was; P-1 receivers pulling the same
    pages of a Broadcast root pay ρ each."""
    from shmcoll.tuning.algorithms import cma
    n, P = 1 << 22, 4

    def priced(collective, write, ratio=0.5):
        models = Models(M, cross_memory=(1e-6, ratio, ratio / 2, write))
        (variant, _, t), = cma.variants(collective, P, n)
        return cma.price(models, collective, t, variant)
    assert priced("allgather", 0.2) < priced("allgather", 0.6)
    assert priced("reduce_scatter", 0.2) == priced("reduce_scatter", 0.6)
    # a Broadcast's P-1 pulls of the root's pages: priced as one reader paying (P-1)ρ
    (variant, _, t), = cma.variants("broadcast", P, n)
    shared = cma.price(Models(M, cross_memory=(1e-6, 0.3, 0.1, 0.2)), "broadcast", t, variant)
    alone = cma.price(Models(M, cross_memory=(1e-6, 0.3 * (P - 1), 0.1, 0.2)), "broadcast",
                      dataclasses.replace(t, sharers=1), variant)
    assert shared == pytest.approx(alone)


def test_cma_reduce_pays_for_its_own_copies_and_for_every_rank_working_at_once():
    """Reduce's fit may fold direct's copies into γ (its root combines each peer's slot
    as it reads it: β 0): cma's kernel copy is a pass of its own, priced by the fit's
    shared β; and where ranks outnumber CPUs every rank's share of the reduction takes
    ranks_per_cpu times as long, as does every system call (algorithms.cma)."""
    from shmcoll.tuning.algorithms import cma, symmetric
    n, P, per_read, ratio, write = 1 << 22, 4, 2e-6, 0.5, 0.25
    folded = CostModel(alpha=3e-6, overhead=0.0, beta=40e-12, gamma=150e-12,
                       setup=(("direct", 4e-6),), bandwidth=(("direct", 0.0), ("ring", 80e-12)))
    (variant, _, t), = cma.variants("reduce", P, n)

    def priced(crowding, rho=ratio):
        models = Models(folded, (), (per_read, rho, rho / 4, write), crowding)
        return cma.price(models, "reduce", t, variant)
    copies = (t.moved - t.written) * 2 * ratio + t.written * 2 * write
    fixed = symmetric.price(folded, "reduce", Terms(t.steps, t.messages), variant)
    for crowding in (1.0, 2.0):
        work = copies * folded.beta + t.reduced * folded.gamma
        assert priced(crowding) == pytest.approx(
            fixed + crowding * work + crowding * per_read * t.reads)
    assert priced(1.0, rho=0.9) > priced(1.0, rho=0.3)     # the copies are not free
    # the other collectives keep their fit's own terms; only σ follows the crowding
    (variant, _, t), = cma.variants("allgather", P, n)
    alone, crowded = (cma.price(Models(M, cross_memory=(per_read, ratio, 0.1, write),
                                       ranks_per_cpu=c), "allgather", t, variant)
                      for c in (1.0, 2.0))
    assert crowded - alone == pytest.approx(per_read * t.reads)


def test_a_communicator_prices_cma_with_its_ranks_per_usable_cpu():
    from shmcoll.communicator import _ranks_per_cpu
    from shmcoll._core.topology import job_cpus
    cpus = job_cpus()
    assert _ranks_per_cpu(1) == 1.0 and _ranks_per_cpu(cpus) == 1.0
    assert _ranks_per_cpu(4 * cpus) == 4.0


@pytest.mark.parametrize("ratio,picked", [(0.3, True), (3.0, False)])
def test_cma_is_picked_only_where_its_measured_reads_make_it_cheapest(ratio, picked):
    models = Models(M, cross_memory=(1e-6, ratio, ratio / 4, ratio))
    variants = selector.cross_memory_variants(2)
    choices = {selector.choose(c, 2, 1 << 24, model=models, variants=variants[c])
               for c in ("allreduce", "allgather", "reduce_scatter", "broadcast")}
    assert ("cma" in choices) == picked, choices
    assert "symmetric" not in choices       # never for ordinary arrays


def test_only_cma_carries_a_least_price_and_it_is_what_unchanged_bytes_cost():
    """The model chooses by the price for fresh bytes; the least price (bytes unchanged
    since the last read) is what a trial may try it for (tuning.trials)."""
    from shmcoll.tuning.algorithms import cma
    models = Models(M, cross_memory=(1e-6, 1.0, 0.25, 1.0))
    table = selector.cost_table("broadcast", 2, 1 << 18, models,
                                selector.cross_memory_variants(2)["broadcast"])
    assert [name for name, c in table.items() if c.least is not None] == ["cma"]
    (variant, _, terms), = cma.variants("broadcast", 2, 1 << 18)
    assert table["cma"].least == pytest.approx(cma.least_price(models, "broadcast", terms, variant))
    assert table["cma"].least < table["cma"].seconds == \
        pytest.approx(cma.price(models, "broadcast", terms, variant))
    chosen = selector.decide("broadcast", 2, 1 << 18, model=models,
                             variants=selector.cross_memory_variants(2)["broadcast"])
    assert chosen.candidate.algorithm != "cma"      # priced for fresh bytes


def test_cma_named_where_the_ranks_cannot_use_it_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="cross-memory attach"):
        selector.decide("allreduce", 2, 1 << 20, algo="cma", model=Models(M))
    assert "cma" not in selector.cost_table("allreduce", 2, 1 << 20, Models(M))
