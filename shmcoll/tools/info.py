"""`shmcoll info`: the build, the settings, the calibration and the algorithms in force
(and, with --topology, the CPUs found and where ranks would be bound)."""
import argparse

from shmcoll import __version__, _engine
from shmcoll._core import settings, topology
from shmcoll.collectives import NAMES
from shmcoll.tools.calibrate import format_gbs
from shmcoll.tuning import calibration, selector
from shmcoll.tuning.algorithms import CROSS_MEMORY, REGISTRY, SINGLE_COPY

HELP = "build, settings, calibration and algorithms in force"


def main(argv):
    p = argparse.ArgumentParser(prog="shmcoll info")
    p.add_argument("-np", "--nprocs", dest="worlds", type=int, nargs="*", default=[2, 4],
                   help="world sizes to show the cost model's decisions for")
    p.add_argument("--topology", action="store_true",
                   help="print the CPU topology found and where P ranks would be bound")
    p.add_argument("--bind", choices=("core", "llc", "numa"), default="core")
    p.add_argument("--cma", action="store_true",
                   help="start 2 ranks to probe cross-memory attach here: whether ranks may "
                        "read each other's memory, what a read costs, and the decisions with it")
    opts = p.parse_args(argv)
    if opts.topology:
        topo = topology.discover()
        print(f"topology: {topo.describe()}")
        print(f"cpus in ring order: {' '.join(str(c.id) for c in topo.cpus)}")
        for world in opts.worlds:
            print(f"P={world}, bind={opts.bind} (rank r's neighbours are r-1 and r+1):")
            print("\n".join(topology.describe_placement(topo, world, opts.bind)))
        return 0
    print(f"shmcoll {__version__}  engine {_engine.__file__}")
    print(f"machine: {calibration.machine_key()}")
    print(f"dtypes: {', '.join(_engine.SUPPORTED_DTYPES)}")
    print("algorithms:")
    for name, alg in REGISTRY.items():
        print(f"  {name:<8} {alg.DESCRIPTION}  [{', '.join(alg.COLLECTIVES)}]")
    for name, alg in {**SINGLE_COPY, **CROSS_MEMORY}.items():
        print(f"  {name:<8} {alg.DESCRIPTION}  [{', '.join(alg.COLLECTIVES)}]")
    print(f"calibration file: {calibration.cache_path()}")
    for world in opts.worlds:
        models, source = calibration.model_for(world)
        print(f"  P={world}: {source}")
        for coll in NAMES:
            m = models.for_collective(coll)
            setup = " ".join(f"{a}={v * 1e6:.2f}us" for a, v in m.setup if v)
            print(f"    {coll:<15} alpha {m.alpha * 1e6:.3g} us, o {m.overhead * 1e6:.3g} us, "
                  f"beta {format_gbs(m.beta)} GB/s, gamma {format_gbs(m.gamma)} GB/s {setup}")
        print(f"    decisions: {selector.describe(world, models)}")
        for case in ("plain", "symmetric", "in place"):
            chosen = selector.describe(world, models,
                                       variants=selector.symmetric_variants(world, case))
            print(f"    with symmetric x, out {case}: {chosen}")
    if opts.cma:
        _probe_cross_memory()
    print("settings:")
    for s in settings.SETTINGS.values():
        value = s.value()
        shown = "unset" if value is None else value
        print(f"  {s.name:<20} = {shown!s:<10} {s.doc}")
    return 0


def _cross_memory_decisions(comm):
    decider = comm._engine.decider
    return comm.cross_memory, str(selector.describe(comm.world_size, decider.model,
                                                    variants=decider.variants))


def _probe_cross_memory():
    from shmcoll.launch import launch
    costs, decisions = launch(_cross_memory_decisions, 2, timeout=60)[0]
    if costs is None:
        print("cross-memory attach: not permitted between ranks here (or SHMCOLL_CMA=off); "
              "algorithm cma is never offered")
        return
    print(f"cross-memory attach: permitted; a read costs {costs[0] * 1e6:.2f} us + "
          f"{costs[1]:.2f}x a channel's two copies of the same bytes, {costs[2]:.2f}x "
          f"where they are unchanged since the last read; a write {costs[3]:.2f}x (2 ranks)")
    print(f"  P=2 decisions with it: {decisions}")
