"""The multi-node simulator: the schedules' rounds agree with the selector's terms,
flat links give the textbook formulas, and the seed's three claims hold."""
import numpy as np
import pytest

from procs import run
from shmcoll.tuning.algorithms import REGISTRY
from shmcoll.tuning.algorithms.rounds import per_rank_totals
from shmcoll.tuning.algorithms.terms import log2_ceil
from shmcoll.simulator import PRESETS, Cluster, Link, candidates, crossover, parse_link, price, simulate
from shmcoll.simulator import seed
from shmcoll.simulator.model import simulated_variants

ALPHA, BETA = 1e-6, 1e-9


def every_variant():
    for name, alg in REGISTRY.items():
        for coll in alg.COLLECTIVES:
            for variant in simulated_variants(alg, coll, 2):
                yield name, coll, variant


@pytest.mark.parametrize("name,collective,variant", list(every_variant()))
def test_rounds_summarise_to_the_selectors_terms(name, collective, variant):
    alg = REGISTRY[name]
    for world in range(2, 18):
        terms = dict((v, t) for v, _, t in alg.variants(collective, world, 1.0))[variant]
        rounds = alg.rounds(collective, world, variant)
        moved, reduced = per_rank_totals(rounds, world)
        assert len(rounds) == terms.steps, world
        assert moved.max() == pytest.approx(terms.moved), world
        assert reduced.max() == pytest.approx(terms.reduced, abs=1e-12), world
        for r in rounds:
            assert (r.src != r.dst).all() and r.src.max() < world and r.dst.max() < world


@pytest.mark.parametrize("world", [2, 3, 5, 8, 16])
def test_flat_links_give_the_textbook_formulas(world):
    cluster = seed.flat(world, ALPHA, BETA)
    depth = log2_ceil(world)
    expect = {   # (latency, seconds per byte): classic α-β with β per byte sent
        ("allreduce", "ring", "ring"): (2 * (world - 1) * ALPHA, 2 * (world - 1) / world * BETA),
        ("allreduce", "tree", "binomial"): (2 * depth * ALPHA, depth * BETA),
        ("allreduce", "direct", "one-shot"): (ALPHA, (world - 1) * BETA),
        ("allgather", "ring", "ring"): ((world - 1) * ALPHA, (world - 1) / world * BETA),
        ("broadcast", "ring", "chain"): ((world - 1) * ALPHA, BETA),
        ("broadcast", "tree", "binomial"): (depth * ALPHA, depth * BETA),
        ("broadcast", "direct", "star"): (ALPHA, (world - 1) * BETA),
        ("gather", "tree", "binomial"): (depth * ALPHA, (world - 1) / world * BETA),
    }
    for (coll, alg, variant), (latency, per_byte) in expect.items():
        p = price(coll, alg, variant, cluster)
        assert p.latency == pytest.approx(latency), (coll, alg)
        assert p.per_byte == pytest.approx(per_byte), (coll, alg)
        assert p.reduce_per_byte == 0


def test_reduction_costs_gamma_per_byte_the_busiest_rank_reduces():
    c = Cluster(1, 8, Link(1e9, 1e-6), gamma=1e-10)
    ring = price("allreduce", "ring", "ring", c)
    assert ring.reduce_per_byte == pytest.approx(1e-10 * 7 / 8)
    assert ring.seconds(1 << 20) == pytest.approx(14e-6 + (1 << 20) * (14 / 8 * 1e-9 + 0.875e-10))
    assert price("allgather", "ring", "ring", c).reduce_per_byte == 0


def test_seed_crossover_p16_is_exact_and_related_to_alpha_p_over_beta():
    rep = seed.tree_ring_crossover(16, ALPHA, BETA)
    m = rep.figures["crossover"]
    assert m == pytest.approx(22 * ALPHA / (2.125 * BETA))        # 10,352.9 bytes
    assert m == pytest.approx(rep.figures["closed_form"])
    assert rep.figures["alpha_p_over_beta"] == pytest.approx(16000)
    assert m / 16000 == pytest.approx(0.647, abs=1e-3)
    tree, ring = rep.figures["tree"], rep.figures["ring"]
    assert tree.seconds(m * 0.99) < ring.seconds(m * 0.99)
    assert ring.seconds(m * 1.01) < tree.seconds(m * 1.01)
    assert "10,353" in "\n".join(rep.lines)
    # the argmin of a tree/ring cost table switches there too
    pool = candidates("allreduce", seed.flat(16, ALPHA, BETA), algorithms=("tree", "ring"))
    picks = [min(pool, key=lambda p: p.seconds(n)).algorithm for n in (8, 10000, 10700, 1 << 20)]
    assert picks == ["tree", "tree", "ring", "ring"]


def test_crossover_leading_order_tends_to_two_over_log2p_minus_two():
    for world in (256, 1024):
        rep = seed.tree_ring_crossover(world, ALPHA, BETA)
        ratio = rep.figures["crossover"] / rep.figures["alpha_p_over_beta"]
        assert ratio == pytest.approx(2 / (np.log2(world) - 2), rel=0.05)


def test_seed_node_aware_ring_beats_interleaved_by_the_flows_per_nic():
    rep = seed.node_aware_ring()
    assert rep.figures["large_message_speedup"] == pytest.approx(8.0)
    rows = {n: (a, m) for n, a, m in rep.figures["rows"]}
    aware, mixed = rows[8]
    assert mixed / aware == pytest.approx(1.0, abs=1e-3)      # latency-bound: same hops
    aware, mixed = rows[1 << 30]
    assert 7.5 < mixed / aware < 8.0
    assert "NIC" in rep.figures["aware"].bottleneck()
    assert "NIC" in rep.figures["interleaved"].bottleneck()
    # one card per device: interleaved flows stop sharing, the orders tie
    rep8 = seed.node_aware_ring(nics=8)
    assert rep8.figures["large_message_speedup"] == pytest.approx(1.0)


def test_seed_ring_tends_to_two_beta_m():
    rep = seed.ring_asymptote(ALPHA, BETA, 1 << 30)
    rows, bound = rep.figures["rows"], rep.figures["bound"]
    bandwidth = [b / bound for _, _, b, _ in rows]
    assert bandwidth == pytest.approx([(w - 1) / w for w, _, _, _ in rows])
    assert all(x < y for x, y in zip(bandwidth, bandwidth[1:]))
    assert bandwidth[-1] > 0.998
    assert all(t >= b for _, t, b, _ in rows)


def test_every_step_names_its_bottleneck_link():
    c = Cluster(2, 4, PRESETS["nvlink4"], PRESETS["ib-ndr"])
    ring = price("allreduce", "ring", "ring", c, "node-aware")
    assert len(ring.steps) == 14 and all(s.crosses_nodes for s in ring.steps)
    tree = price("broadcast", "tree", "binomial", c, "node-aware")
    crossing = [s for s in tree.steps if s.crosses_nodes]
    assert len(crossing) == 1 and "NIC" in crossing[0].bottleneck
    assert crossing[0].latency == PRESETS["ib-ndr"].latency
    assert all("NVLink" in s.bottleneck for s in tree.steps if not s.crosses_nodes)


def test_simulate_auto_is_the_argmin_and_reports_bandwidths():
    c = Cluster(1, 8, PRESETS["nvlink4"])
    sizes = [8, 1 << 20, 1 << 28]
    auto = simulate("allreduce", sizes, c)
    for r in auto:
        every = [p.seconds(r.size) for p in candidates("allreduce", c)]
        assert r.seconds == pytest.approx(min(every))
        assert r.busbw == pytest.approx(r.algbw * 2 * 7 / 8)
    ring = simulate("allreduce", sizes, c, algorithm="ring")
    assert [r.priced.algorithm for r in ring] == ["ring"] * 3


def test_placements():
    c = Cluster(2, 4, PRESETS["nvlink4"])
    assert c.placement("node-aware").tolist() == list(range(8))
    assert c.placement("interleaved").tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert c.placement([7, 6, 5, 4, 3, 2, 1, 0]).tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    with pytest.raises(ValueError):
        c.placement([0, 0, 1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError):
        Cluster(0, 4, PRESETS["nvlink4"])


def test_links_parse_presets_and_units():
    assert parse_link("ib-ndr").bandwidth == 50e9
    assert parse_link("nvlink4").bandwidth == 600e9
    assert parse_link("pcie5").bandwidth == 64e9
    link = parse_link("25GB/s:3us")
    assert (link.bandwidth, link.latency) == (25e9, pytest.approx(3e-6))
    assert parse_link("1G").latency == 0
    for bad in ("fast", "0G:1us", "10G:-1us", "10G:1parsec"):
        with pytest.raises(ValueError):
            parse_link(bad)


def test_one_rank_costs_nothing():
    r = simulate("allreduce", [1 << 20], Cluster(1, 1, PRESETS["nvlink4"]))[0]
    assert r.seconds == 0


def test_crossover_none_when_one_always_wins():
    c = seed.flat(8, ALPHA, BETA)
    two_shot = price("allreduce", "direct", "two-shot", c)
    ring = price("allreduce", "ring", "ring", c)
    assert crossover(two_shot, ring) is None


def run_cli(*args):
    return run("-m", "shmcoll", "simulate", *args, timeout=120)


def test_cli_reproductions_print_their_figures():
    res = run_cli("--reproduce", "crossover")
    assert res.returncode == 0 and "10,353 bytes" in res.stdout and "0.647" in res.stdout
    res = run_cli("--reproduce", "node-aware")
    assert res.returncode == 0 and "8.00x" in res.stdout
    res = run_cli("--reproduce", "asymptote")
    assert res.returncode == 0 and "1024" in res.stdout


def test_cli_sweep_table_steps_and_errors(tmp_path):
    res = run_cli("allreduce", "--nodes", "2", "--per-node", "4", "--order", "interleaved",
                  "-b", "1K", "-e", "16M", "-f", "16", "--steps")
    assert res.returncode == 0, res.stderr
    assert "fastest" in res.stdout and "# steps of" in res.stdout and "NIC0" in res.stdout
    res = run_cli("allreduce", "--nodes", "1", "--per-node", "16", "--intra", "1GB/s:1us",
                  "--algo", "all", "-b", "8", "-e", "1M")
    assert res.returncode == 0 and "crossover" in res.stdout
    res = run_cli("--per-node", "16", "--intra", "1GB/s:1us", "--algo", "tree,ring", "-e", "1M")
    assert res.returncode == 0 and "tree (binomial) -> ring at 10,353 B" in res.stdout
    assert run_cli("--intra", "warp-drive").returncode == 2
    assert run_cli("allgather", "--algo", "bruck").returncode == 2
    assert run_cli("--nodes", "0").returncode == 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        res = run_cli("--plot", str(tmp_path / "s.png"))
        assert res.returncode == 2 and "matplotlib" in res.stderr
        return
    res = run_cli("--plot", str(tmp_path / "s.png"), "--per-node", "16", "--intra", "1G:1us")
    assert res.returncode == 0 and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


# -- hierarchical compositions (what shmcoll.mpi runs) ------------------------------------

def two_by_eight(nics=1, intra="nvlink4"):
    return Cluster(2, 8, parse_link(intra), parse_link("ib-ndr"), nics=nics)


def test_a_composition_is_its_phases_one_after_another():
    from shmcoll.simulator import hierarchy
    cluster = two_by_eight()
    placement = cluster.placement("node-aware")
    phases = hierarchy.COMPOSITIONS["allreduce"]["hierarchical"]
    per_phase = [hierarchy.phase_candidates(p, cluster, placement) for p in phases]
    parts = [min(c, key=lambda p: p.latency) for c in per_phase]
    whole = hierarchy.compose("allreduce", "hierarchical", parts)
    assert whole.latency == pytest.approx(sum(p.latency for p in parts))
    assert whole.per_byte == pytest.approx(sum(p.per_byte for p in parts))
    assert len(whole.steps) == sum(len(p.steps) for p in parts)
    stages = [s.stage for s in whole.steps]
    assert stages == sorted(stages)             # phases never overlap
    assert whole.variant == "/".join(p.algorithm for p in parts)
    assert whole.seconds(1 << 20) == pytest.approx(sum(p.seconds(1 << 20) for p in parts))


def test_hierarchical_crosses_the_network_once_per_byte_with_every_nic():
    """With a free node fabric, leader sends all n through one NIC per node and
    hierarchical n/L through each of L NICs: 1/L of the network time."""
    from shmcoll.simulator import hierarchy
    cluster = Cluster(2, 8, Link(1e18, 0.0), parse_link("ib-ndr"), nics=8)
    pool = hierarchy.candidates("allreduce", cluster, "node-aware", ["hierarchical", "leader"])
    best = {name: min((p for p in pool if p.algorithm == name), key=lambda p: p.per_byte)
            for name in ("hierarchical", "leader")}
    assert best["hierarchical"].per_byte == pytest.approx(best["leader"].per_byte / 8, rel=1e-6)


def test_on_two_nodes_of_eight_the_model_picks_direct_then_hierarchical():
    from shmcoll.simulator import hierarchy
    pool = hierarchy.candidates("allreduce", two_by_eight(nics=8))
    assert {p.algorithm for p in pool} == {"hierarchical", "leader", "flat"}
    small = hierarchy.choose(pool, 8)
    assert small.name == "flat" and small.priced.variant.startswith("direct")
    large = hierarchy.choose(pool, 128 << 20)
    assert large.name == "hierarchical" and large.reason == "cost model"
    assert large.priced.seconds(128 << 20) == min(s for _, s in large.table)
    forced = hierarchy.choose(pool, 128 << 20, "leader")
    assert forced.name == "leader" and forced.reason == "algo="
    assert "leader" in forced.describe(128 << 20) and "modelled us" in forced.describe(1)
    with pytest.raises(ValueError, match="available: hierarchical, leader, flat, auto"):
        hierarchy.choose(pool, 8, "ring")


def test_every_collective_has_its_compositions_and_flat():
    from shmcoll.simulator import hierarchy
    cluster = Cluster(3, 4, parse_link("pcie5"), parse_link("ib-ndr"))
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                       "gather", "scatter", "alltoall"):
        pool = hierarchy.candidates(collective, cluster)
        assert {p.algorithm for p in pool} == set(hierarchy.names_for(collective))
        assert all(p.seconds(1 << 20) > 0 for p in pool)


def test_uneven_nodes_priced_on_a_partial_placement():
    """Nodes of 3 and 1 ranks: the ranks' devices in a 2 x 3 cluster."""
    from shmcoll.simulator import hierarchy
    cluster = Cluster(2, 3, parse_link("pcie5"), parse_link("ib-ndr"))
    pool = hierarchy.candidates("allreduce", cluster, [0, 1, 2, 3], ["leader", "flat"])
    assert {p.world for p in pool if p.algorithm == "flat"} == {4}
    with pytest.raises(ValueError, match="distinct devices"):
        hierarchy.candidates("allreduce", cluster, [0, 0, 1, 2])
    with pytest.raises(ValueError, match="distinct devices"):
        hierarchy.candidates("allreduce", cluster, [0, 1, 6])


def test_flat_clusters_have_no_compositions():
    one_node = candidates("allreduce", Cluster(1, 8, parse_link("nvlink4")))
    one_per_node = candidates("allreduce", Cluster(8, 1, parse_link("nvlink4")))
    for pool in (one_node, one_per_node):
        assert not {"hierarchical", "leader"} & {p.algorithm for p in pool}


def test_cli_prices_the_compositions_on_several_nodes_only():
    res = run_cli("allreduce", "--nodes", "2", "--per-node", "4", "--algo",
                  "hierarchical,leader,ring", "-b", "8", "-e", "64M", "-f", "4096")
    assert res.returncode == 0, res.stderr
    assert "hierarchical us" in res.stdout and "leader us" in res.stdout
    assert "hierarchical (" in res.stdout
    assert run_cli("allreduce", "--nodes", "1", "--algo", "hierarchical").returncode == 2
