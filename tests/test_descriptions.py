"""The facts written on both sides of the C/Python line agree: what the engine runs
(sc_run.c's schedules), what the cost model prices (the algorithm modules), what the
GPU path runs (cuda/path.VARIANTS), and the collectives themselves."""
import pytest

from shmcoll import _engine, collectives
from shmcoll.cuda.path import HOST_ONLY, VARIANTS
from shmcoll.tuning.algorithms import ALL, REGISTRY, SINGLE_COPY, name_of_code


def priced_schedules(world=4, sizes=(8, 4096)):
    """{(collective, engine code)} of every variant the algorithm modules price at
    some of `sizes` (the single-copy ones included; direct's inline and eager ones
    only where every rank's part fits in its call record, or in its part buffer)."""
    return {(coll, code) for alg in ALL.values() for coll in alg.COLLECTIVES
            for nbytes in sizes for _, code, _ in alg.variants(coll, world, nbytes)}


def test_single_copy_schedules_are_apart_from_the_ordinary_ones():
    assert not set(SINGLE_COPY) & set(REGISTRY)
    assert name_of_code(_engine.SCHEDULE_CODES["symmetric_two_shot"], "allreduce") == \
        "symmetric (two-shot)"


def test_the_engine_runs_exactly_what_the_cost_model_prices():
    assert _engine.implemented() == priced_schedules()


@pytest.mark.parametrize("world", [2, 3, 8])
def test_variant_codes_do_not_depend_on_the_world_size(world):
    assert priced_schedules(world) == priced_schedules()


def test_algorithm_codes_are_the_engines():
    assert {code for _, code in priced_schedules()} == set(_engine.SCHEDULE_CODES.values())
    assert name_of_code(_engine.SCHEDULE_CODES["direct_two_shot"], "allreduce") == \
        "direct (two-shot)"


def test_the_gpu_path_runs_only_variants_the_cost_model_prices():
    for coll, algorithms in VARIANTS.items():
        for name, variants in algorithms.items():
            priced = {v for v, _, _ in REGISTRY[name].variants(coll, 4, 4096)}
            assert set(variants) <= priced, (coll, name, variants, priced)
    assert set(VARIANTS) == set(collectives.NAMES) - set(HOST_ONLY)


def test_collectives_are_the_engines_and_each_has_an_algorithm():
    # alltoallv is alltoall's schedule over agreed byte ranges: nothing to choose
    assert set(collectives.NAMES) == set(_engine.COLLECTIVE_CODES) - {"barrier", "alltoallv"}
    for c in collectives.ALL:
        assert _engine.COLLECTIVE_CODES[c.name] == c.code
        assert any(c.name in alg.COLLECTIVES for alg in REGISTRY.values()), c.name
    for alg in REGISTRY.values():
        assert set(alg.COLLECTIVES) <= set(collectives.NAMES), alg.NAME


def test_collective_properties():
    by = collectives.BY_NAME
    assert collectives.REDUCING == ("allreduce", "reduce_scatter", "reduce")
    assert set(collectives.ROOTED) == {"broadcast", "reduce", "gather", "scatter"}
    assert by["allgather"].priced_bytes(100, 4) == 400
    assert by["allreduce"].priced_bytes(100, 4) == 100
    assert by["allreduce"].bus_factor(4) == 1.5
    assert by["broadcast"].bus_factor(4) == 1.0
    assert by["allgather"].bus_factor(4) == 0.75
    assert by["alltoall"].bus_factor(4) == 0.75 and by["sendrecv"].bus_factor(4) == 1.0
    assert by["alltoall"].priced_bytes(100, 4) == 100
    assert all(c.bus_factor(1) == 1.0 for c in collectives.ALL)
    assert by["gather"].result_on(1, 0) is False and by["gather"].result_on(0, 0) is True
