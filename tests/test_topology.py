"""CPU topology from sysfs (fake machines laid out like /sys) and rank placement."""
import os

import pytest

import shmcoll
from shmcoll._core import topology


def fake_sysfs(root, packages=2, nodes_per_package=2, llc_per_node=4, cores_per_llc=2, smt=2):
    """A machine like Linux describes it: CPU i and i + ncores are SMT siblings."""
    ncores = packages * nodes_per_package * llc_per_node * cores_per_llc
    ncpus = ncores * smt
    cpu_root = root / "devices" / "system" / "cpu"
    cpu_root.mkdir(parents=True)
    (cpu_root / "online").write_text(f"0-{ncpus - 1}\n")
    node_cpus = {}
    for cpu in range(ncpus):
        core = cpu % ncores
        llc = core // cores_per_llc
        node = llc // llc_per_node
        package = node // nodes_per_package
        d = cpu_root / f"cpu{cpu}"
        (d / "topology").mkdir(parents=True)
        (d / "topology" / "physical_package_id").write_text(f"{package}\n")
        siblings = [core + k * ncores for k in range(smt)]
        (d / "topology" / "thread_siblings_list").write_text(",".join(map(str, siblings)) + "\n")
        for index, (level, members) in enumerate([
                (1, siblings), (2, siblings),
                (3, [c + k * ncores for k in range(smt)
                     for c in range(llc * cores_per_llc, (llc + 1) * cores_per_llc)])]):
            cache = d / "cache" / f"index{index}"
            cache.mkdir(parents=True)
            (cache / "level").write_text(f"{level}\n")
            (cache / "shared_cpu_list").write_text(",".join(map(str, sorted(members))) + "\n")
        node_cpus.setdefault(node, []).append(cpu)
    for node, cpus in node_cpus.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(",".join(map(str, cpus)) + "\n")
    return ncpus


@pytest.mark.parametrize("smt", [1, 2])
def test_two_sockets_two_numa_four_llc_groups(tmp_path, smt):
    n = fake_sysfs(tmp_path, smt=smt)
    topo = topology.discover(str(tmp_path), allowed=set(range(n)))
    assert (topo.count("package"), topo.count("node"), topo.count("llc"), topo.count("core")) == \
        (2, 4, 16, 32)
    assert len(topo.cpus) == 32 * smt
    first = topo.cpus[:32]
    assert [c.id for c in first] == list(range(32))        # one thread per core first
    # neighbours in ring order share an LLC group in pairs, a NUMA node in eights
    for a, b in zip(first, first[1:]):
        if a.id % 2 == 0:
            assert a.llc == b.llc
        if a.id % 8 != 7:
            assert a.node == b.node
    assert "SMT x2" in topo.describe() if smt == 2 else "SMT" not in topo.describe()


def test_placement_by_core_llc_and_numa(tmp_path):
    n = fake_sysfs(tmp_path)
    topo = topology.discover(str(tmp_path), allowed=set(range(n)))
    core = topology.placement(topo, 8, "core")
    assert core == [(i,) for i in range(8)]
    llc = topology.placement(topo, 3, "llc")
    assert llc[0] == llc[1] == (0, 1, 32, 33) and llc[2] == (2, 3, 34, 35)
    numa = topology.placement(topo, 9, "numa")
    assert numa[0] == numa[7] == tuple(sorted(list(range(8)) + list(range(32, 40))))
    assert numa[8][0] == 8
    # more ranks than cores: the second SMT threads, then around again
    assert topology.placement(topo, 33, "core")[32] == (32,)
    assert topology.placement(topo, 65, "core")[64] == (0,)
    with pytest.raises(ValueError, match="bind must be one of"):
        topology.placement(topo, 2, "socket")


def test_restricted_affinity_keeps_ranks_inside_it(tmp_path):
    fake_sysfs(tmp_path)
    allowed = set(range(24, 32)) | set(range(56, 64))        # NUMA node 3 only
    topo = topology.discover(str(tmp_path), allowed=allowed)
    assert {c.id for c in topo.cpus} == allowed and topo.count("node") == 1
    for cpus in topology.placement(topo, 20, "core"):
        assert set(cpus) <= allowed
    assert topology.placement(topo, 2, "numa")[0] == tuple(sorted(allowed))


def test_missing_sysfs_is_one_flat_domain(tmp_path):
    topo = topology.discover(str(tmp_path / "nothing"), allowed={0, 1, 2})
    assert [c.id for c in topo.cpus] == [0, 1, 2] and topo.count("llc") == 1


def test_parse_list():
    assert topology.parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert topology.parse_list("") == []


def _affinity(comm):
    return sorted(os.sched_getaffinity(0)), float(comm.allreduce(
        __import__("numpy").ones(4, "float32"))[0])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity control")
def test_launch_binds_ranks_in_topology_order():
    topo = topology.discover()
    want = topology.placement(topo, 3, "core")
    got = shmcoll.launch(_affinity, 3, bind="core")
    assert [tuple(cpus) for cpus, _ in got] == [tuple(sorted(w)) for w in want]
    assert all(total == 3.0 for _, total in got)
    unbound = shmcoll.launch(_affinity, 2)
    assert unbound[0][0] == sorted(os.sched_getaffinity(0))


def test_info_topology_prints_the_domains_and_the_ring_order():
    from procs import run
    res = run("-m", "shmcoll", "info", "--topology", "-np", "3")
    assert res.returncode == 0, res.stderr
    assert "topology:" in res.stdout and "cpus in ring order" in res.stdout
    assert sum(l.startswith("  rank ") for l in res.stdout.splitlines()) == 3
