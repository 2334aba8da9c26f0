"""The machine's CPU topology, read from sysfs, and where ranks go on it.

A ring is as slow as its slowest edge, so neighbouring ranks should share as much as
possible: a last-level cache, then a NUMA node, then a package.  `discover()` reads
packages, NUMA nodes, last-level-cache groups and SMT siblings from
/sys/devices/system/{cpu,node} (the root is a parameter, so tests lay out fake
machines), restricted to the CPUs this job may use.  `placement()` lists CPUs in
topology order — one per physical core first, cores of one LLC group together, LLC
groups of one NUMA node together — and gives rank r the r-th, so ring neighbours r
and r+1 are as close as the machine allows and the binomial tree's subtrees
(contiguous rank ranges) stay inside one domain for as long as they fit.

    launch(fn, P, bind="core")   rank r pinned to one CPU: its core in that order
    launch(fn, P, bind="llc")    rank r allowed on every CPU of its LLC group
    launch(fn, P, bind="numa")   rank r allowed on every CPU of its NUMA node
"""
import os
from dataclasses import dataclass

BINDINGS = ("core", "llc", "numa")


@dataclass(frozen=True)
class Cpu:
    id: int
    package: int
    node: int
    llc: int        # the lowest CPU id sharing its last-level cache: names the group
    core: int       # the lowest CPU id among its SMT siblings: names the physical core


@dataclass(frozen=True)
class Topology:
    cpus: tuple     # the usable CPUs, in topology order (see order())

    def group(self, cpu, level):
        """The usable CPUs sharing `level` ('core', 'llc', 'numa', 'package') with cpu."""
        attr = {"core": "core", "llc": "llc", "numa": "node", "package": "package"}[level]
        mine = getattr(cpu, attr)
        return tuple(c.id for c in self.cpus if getattr(c, attr) == mine)

    def count(self, attr):
        return len({getattr(c, attr) for c in self.cpus})

    def describe(self):
        cores = self.count("core")
        smt = len(self.cpus) // cores if cores else 1
        return (f"{self.count('package')} package(s), {self.count('node')} NUMA node(s), "
                f"{self.count('llc')} LLC group(s), {cores} core(s), {len(self.cpus)} usable "
                f"CPU(s){f', SMT x{smt}' if smt > 1 else ''}")


def parse_list(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _llc_group(cpu_dir, cpu):
    """Lowest CPU id sharing the highest-level cache of `cpu` (itself if unknown)."""
    best_level, members = -1, [cpu]
    cache = os.path.join(cpu_dir, "cache")
    for index in sorted(os.listdir(cache)) if os.path.isdir(cache) else []:
        level = _read(os.path.join(cache, index, "level"))
        shared = _read(os.path.join(cache, index, "shared_cpu_list"))
        if level and shared and int(level) > best_level:
            best_level, members = int(level), parse_list(shared)
    return min(members)


def _nodes(root):
    node_dir = os.path.join(root, "devices", "system", "node")
    nodes = {}
    for name in os.listdir(node_dir) if os.path.isdir(node_dir) else []:
        if name.startswith("node") and name[4:].isdigit():
            for cpu in parse_list(_read(os.path.join(node_dir, name, "cpulist"), "")):
                nodes[cpu] = int(name[4:])
    return nodes


def discover(root="/sys", allowed=None):
    """The usable CPUs of this machine (or of the fake one under `root`), in topology
    order.  `allowed`: the CPU ids this job may use (default: this process's affinity)."""
    cpu_root = os.path.join(root, "devices", "system", "cpu")
    online = parse_list(_read(os.path.join(cpu_root, "online"), "") or "")
    if allowed is None:
        allowed = set(allowed_cpus())
    nodes = _nodes(root)
    cpus = []
    for cpu in online:
        if cpu not in allowed:
            continue
        d = os.path.join(cpu_root, f"cpu{cpu}")
        topo = os.path.join(d, "topology")
        package = int(_read(os.path.join(topo, "physical_package_id"), "0"))
        siblings = parse_list(_read(os.path.join(topo, "thread_siblings_list"), str(cpu)))
        cpus.append(Cpu(cpu, package, nodes.get(cpu, 0), _llc_group(d, cpu), min(siblings)))
    if not cpus:      # no sysfs (a container without it): one flat domain
        cpus = [Cpu(c, 0, 0, 0, c) for c in sorted(allowed)]
    return Topology(tuple(order(cpus)))


def order(cpus):
    """Topology order: first the first SMT thread of every core, cores grouped by LLC,
    LLC groups by NUMA node, nodes by package; then the second threads likewise."""
    def thread_index(c):
        return sorted(x.id for x in cpus if x.core == c.core).index(c.id)
    return sorted(cpus, key=lambda c: (thread_index(c), c.package, c.node, c.llc, c.core, c.id))


def placement(topology, world, bind="core"):
    """For each rank, the CPU ids it may run on under `bind` (ranks beyond the number
    of CPUs wrap around, so oversubscribed ranks share cores evenly)."""
    if bind not in BINDINGS:
        raise ValueError(f"bind must be one of {', '.join(BINDINGS)} or None, got {bind!r}")
    level = {"core": None, "llc": "llc", "numa": "numa"}[bind]
    out = []
    for rank in range(world):
        cpu = topology.cpus[rank % len(topology.cpus)]
        out.append((cpu.id,) if level is None else topology.group(cpu, level))
    return out


def bind_self(cpus):
    """Restrict this process to `cpus` (ignored where affinity cannot be set)."""
    try:
        os.sched_setaffinity(0, set(cpus))
    except (AttributeError, OSError):
        pass


def describe_placement(topology, world, bind="core"):
    """Lines for `shmcoll info --topology`: each rank, its CPUs and domains."""
    by_id = {c.id: c for c in topology.cpus}
    lines = []
    for rank, cpus in enumerate(placement(topology, world, bind)):
        c = by_id[cpus[0]]
        where = f"package {c.package} node {c.node} llc {c.llc} core {c.core}"
        lines.append(f"  rank {rank:>3} -> cpu {','.join(map(str, cpus)):<12} ({where})")
    return lines


# -- counting CPUs ------------------------------------------------------------------

def online_cpus():
    """CPUs the machine has online."""
    return os.cpu_count() or 1


def allowed_cpus():
    """The ids of the CPUs this process may run on (its affinity mask), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(online_cpus()))


def usable_cpus():
    """How many CPUs this process may run on, not just the CPUs online."""
    return len(allowed_cpus())


def job_cpus():
    """CPUs the ranks of a job share, the same number in every rank of the machine or
    container: what decisions that every rank must agree on are based on.  A rank's
    own affinity mask (which binding narrows to one CPU) does not enter."""
    cpus = online_cpus()
    limit = cgroup_cpus()
    return min(cpus, limit) if limit else cpus


def cgroup_cpus(root="/sys/fs/cgroup"):
    """CPUs the container may use (cgroup v2 cpuset and quota), or None if unlimited."""
    limits = []
    effective = _read(os.path.join(root, "cpuset.cpus.effective"))
    if effective:
        try:
            limits.append(len(parse_list(effective)))
        except ValueError:
            pass
    try:
        quota, period = (_read(os.path.join(root, "cpu.max")) or "max").split()[:2]
        limits.append(max(1, -(-int(quota) // int(period))))
    except ValueError:          # "max": no quota
        pass
    return min(limits) if limits else None
