"""Cost formulas against hand-computed values; selection and overrides."""
import pytest

from shmcoll import selector
from shmcoll.algorithms import ring
from shmcoll.selector import CostModel

M = CostModel(alpha=1e-6, beta=1e-9, gamma=0.5e-9)


def test_ring_allreduce_cost_matches_patarasuk_yuan():
    # 2(P-1)α + 2n(P-1)/P β + n(P-1)/P γ with P=4, n=1 MB
    want = 6e-6 + 2 * 1e6 * 0.75 * 1e-9 + 1e6 * 0.75 * 0.5e-9
    assert ring.cost("allreduce", 4, 1e6, M) == pytest.approx(want)


def test_ring_reduce_scatter_and_allgather_costs():
    assert ring.cost("reduce_scatter", 8, 8e6, M) == pytest.approx(7e-6 + 7e6 * 1e-9 + 7e6 * 0.5e-9)
    assert ring.cost("allgather", 2, 2e3, M) == pytest.approx(1e-6 + 1e3 * 1e-9)
    assert ring.cost("allreduce", 1, 1e9, M) == 0.0


def test_direct_cost_and_crossover():
    from shmcoll.algorithms import direct
    assert direct.cost("allreduce", 4, 1e3, M) == pytest.approx(1e-6 + 6e3 * 1e-9 + 3e3 * 0.5e-9)
    assert selector.choose("allreduce", 2, 8) == "direct"
    assert selector.choose("allreduce", 2, 64 << 20) == "ring"
    with pytest.raises(ValueError, match="unknown algorithm 'direct' for reduce_scatter"):
        selector.choose("reduce_scatter", 4, 8, "direct")


def test_choose_defaults_and_overrides():
    assert selector.choose("allreduce", 4, 1 << 20) == "ring"
    assert selector.choose("allreduce", 4, 1 << 20, "ring") == "ring"
    assert selector.choose("allreduce", 4, 1 << 20, "auto") == "ring"
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        selector.choose("allreduce", 4, 8, "tree")


def test_override_grammar():
    parse = selector.parse_overrides
    assert parse("") == {} and parse(None) == {}
    assert parse("ring") == {"allreduce": "ring", "reduce_scatter": "ring", "allgather": "ring"}
    assert parse("allreduce:direct") == {"allreduce": "direct"}
    # a per-collective entry wins over a plain one, whatever the order
    assert parse("allreduce:direct; ring")["allreduce"] == "direct"
    assert parse("ring,allreduce:direct")["allgather"] == "ring"
    for bad in ("tree", "allreduce:tree", "broadcastx:ring", "reduce_scatter:direct"):
        with pytest.raises(ValueError, match="SHMCOLL_ALGO"):
            parse(bad)


def test_override_applies_only_to_auto_choices():
    over = {"allreduce": "direct"}
    assert selector.code("allreduce", 4, 64 << 20, overrides=over) == 1
    assert selector.code("allreduce", 4, 64 << 20, "ring", overrides=over) == 0
    assert selector.code("allreduce", 4, 64 << 20) == 0
