"""The `shmcoll` command: a registry of subcommands (perf, info)."""
import argparse
import sys

SUBCOMMANDS = {}


def subcommand(name, help):
    def register(fn):
        SUBCOMMANDS[name] = (fn, help)
        return fn
    return register


def _add_perf_args(p):
    from shmcoll.sizes import parse_size
    from shmcoll.selector import ALL_COLLECTIVES
    from shmcoll.ops import ReduceOp
    p.add_argument("collective", choices=ALL_COLLECTIVES)
    p.add_argument("-np", "--nprocs", dest="np", type=int, default=2, help="number of ranks")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", dest="factor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (0: auto)")
    p.add_argument("-w", "--warmup", type=int, default=-1, help="untimed calls first (-1: auto)")
    p.add_argument("-d", "--datatype", dest="dtype", default="float32")
    p.add_argument("-o", "--op", default="sum", choices=[m.value for m in ReduceOp])
    p.add_argument("--algo", default=None,
                   help="NAME (force it), auto (the cost model, default) or all (one block per "
                        "algorithm, fastest marked)")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of rooted collectives")
    p.add_argument("--bind", choices=("core", "llc", "numa"), default=None,
                   help="pin ranks in topology order (default: the scheduler places them)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="busbw against size per algorithm, modelled crossovers marked "
                        "(needs matplotlib: pip install 'shmcoll[plot]')")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: time device arrays through the CUDA IPC path (needs CuPy)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")


@subcommand("perf", "throughput tester in the style of nccl-tests")
def _perf(argv):
    from shmcoll import perf
    p = argparse.ArgumentParser(prog="shmcoll perf", description=perf.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_perf_args(p)
    opts = p.parse_args(argv)
    _validate_perf(p, opts)
    return perf.run(opts)


def _validate_perf(parser, opts):
    import numpy as np
    from shmcoll import _engine
    if opts.np < 1:
        parser.error("-np must be >= 1")
    if opts.dtype not in _engine.SUPPORTED_DTYPES:
        parser.error(f"unsupported dtype {opts.dtype}; supported: {', '.join(_engine.SUPPORTED_DTYPES)}")
    try:
        from shmcoll.perf import size_sweep
        size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    except ValueError as e:
        parser.error(str(e))
    if not 0 <= opts.root < opts.np:
        parser.error(f"-r/--root must be in [0, {opts.np})")
    if opts.algo == "auto":
        opts.algo = None
    if opts.algo not in (None, "all"):
        from shmcoll.selector import algorithms_for
        if opts.algo not in algorithms_for(opts.collective):
            parser.error(f"--algo {opts.algo}: not an algorithm of {opts.collective}; choose from "
                         f"{', '.join(algorithms_for(opts.collective) + ['auto', 'all'])}")
    if opts.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib, which is not installed "
                         "(pip install matplotlib, or pip install 'shmcoll[plot]')")
    if opts.device == "cuda":
        from shmcoll.cuda import array_converters
        from shmcoll.errors import DeviceError
        try:
            array_converters()
        except DeviceError as e:
            parser.error(f"--device cuda: {e}")
        if opts.bind:
            parser.error("--device cuda: --bind pins CPU ranks; leave it out")
    if opts.dtype == "bfloat16":
        import ml_dtypes
        opts.dtype = np.dtype(ml_dtypes.bfloat16)


@subcommand("bench-compare", "compare saved benchmark runs: raw and normalised changes")
def _bench_compare(argv):
    from shmcoll import benchcmp
    return benchcmp.main(argv)


@subcommand("bench-ab", "compare two builds or settings, interleaved in one session")
def _bench_ab(argv):
    from shmcoll import abtest
    return abtest.main(argv)


@subcommand("cleanup", "remove shared-memory entries left by dead jobs of this user")
def _cleanup(argv):
    """Remove this user's /dev/shm entries of jobs with no live process (a job unlinks
    its entry once every rank attached, so only jobs that died before that leave one)."""
    from shmcoll import segment
    p = argparse.ArgumentParser(prog="shmcoll cleanup", description=_cleanup.__doc__)
    p.add_argument("-n", "--dry-run", action="store_true", help="list, do not remove")
    opts = p.parse_args(argv)
    stale = segment.stale_entries()
    for name in stale:
        if not opts.dry_run and not segment.remove_stale(name):
            continue
        print(f"{'stale' if opts.dry_run else 'removed'} /dev/shm{name}")
    print(f"# {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}"
          f"{' (dry run)' if opts.dry_run else ' removed'}; live jobs untouched")
    return 0


@subcommand("calibrate", "measure the cost model's parameters on this machine")
def _calibrate(argv):
    from shmcoll import calibrate, calibration, selector
    from shmcoll.algorithms.terms import Models
    from shmcoll.launch import launch
    p = argparse.ArgumentParser(prog="shmcoll calibrate", description=calibrate.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--nprocs", dest="worlds", type=int, nargs="+", default=[2, 4],
                   help="world sizes to calibrate (default: 2 4)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timings")
    p.add_argument("--dry-run", action="store_true", help="measure and print, do not save")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: calibrate the GPU path (device arrays; stored per GPU)")
    opts = p.parse_args(argv)
    if any(w < 2 for w in opts.worlds):
        p.error("world sizes must be >= 2 (one rank has nothing to calibrate)")
    device = opts.device == "cuda"
    variants = None
    if device:
        from shmcoll.cuda import array_converters
        from shmcoll.cuda.path import VARIANTS as variants
        from shmcoll.errors import DeviceError
        try:
            array_converters()
        except DeviceError as e:
            p.error(f"--device cuda: {e}")
    sizes = calibrate.QUICK_SIZES if opts.quick else calibrate.SIZES
    budget = 0.02 if opts.quick else 0.1
    for world in opts.worlds:
        print(f"# calibrating {world} ranks ({len(sizes)} sizes per algorithm)...", flush=True)
        rows, gpu = launch(calibrate.calibrate_worker, world, args=(sizes, budget, device))[0]
        fits = calibrate.fit_all(rows, world)
        print(f"  {'collective':<15} {'alpha us':>8} {'o us':>6} {'beta GB/s':>9} "
              f"{'gamma GB/s':>10} {'rms err':>7}  setup us")
        for coll, (m, err) in fits.items():
            setup = " ".join(f"{a}={v * 1e6:.2f}" for a, v in m.setup if v)
            print(f"  {coll:<15} {m.alpha * 1e6:>8.3f} {m.overhead * 1e6:>6.3f} "
                  f"{_gbs(m.beta):>9} {_gbs(m.gamma):>10} {err:>7.1%}  {setup}")
        base = calibration.DEVICE_DEFAULT if device else calibration.default_model(world)
        models = Models(base.default, tuple(sorted((c, m) for c, (m, _) in fits.items())))
        print(f"  decisions: {selector.describe(world, models, variants=variants)}")
        if not opts.dry_run:
            path = calibration.save(world, fits, {"measurements": len(rows)}, device=gpu)
            print(f"  saved to {path}")
    return 0


def _gbs(seconds_per_byte):
    return f"{1 / seconds_per_byte / 1e9:.2f}" if seconds_per_byte else "inf"


@subcommand("simulate", "collectives on a modelled multi-node cluster (alpha-beta)")
def _simulate(argv):
    from shmcoll.simulator import command
    return command.main(argv)


@subcommand("info", "build, settings, calibration and algorithms in force")
def _info(argv):
    from shmcoll import calibration, config, __version__, _engine, selector
    from shmcoll.algorithms import REGISTRY
    p = argparse.ArgumentParser(prog="shmcoll info")
    p.add_argument("-np", "--nprocs", dest="worlds", type=int, nargs="*", default=[2, 4],
                   help="world sizes to show the cost model's decisions for")
    p.add_argument("--topology", action="store_true",
                   help="print the CPU topology found and where P ranks would be bound")
    p.add_argument("--bind", choices=("core", "llc", "numa"), default="core")
    opts = p.parse_args(argv)
    if opts.topology:
        from shmcoll import topology
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
    print(f"calibration file: {calibration.cache_path()}")
    for world in opts.worlds:
        models, source = calibration.model_for(world)
        print(f"  P={world}: {source}")
        for coll in selector.ALL_COLLECTIVES:
            m = models.for_collective(coll)
            setup = " ".join(f"{a}={v * 1e6:.2f}us" for a, v in m.setup if v)
            print(f"    {coll:<15} alpha {m.alpha * 1e6:.3g} us, o {m.overhead * 1e6:.3g} us, "
                  f"beta {_gbs(m.beta)} GB/s, gamma {_gbs(m.gamma)} GB/s {setup}")
        print(f"    decisions: {selector.describe(world, models)}")
    print("settings:")
    for s in config.SETTINGS.values():
        value = s.value()
        shown = "unset" if value is None else value
        print(f"  {s.name:<20} = {shown!s:<10} {s.doc}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        print("usage: shmcoll {" + ",".join(SUBCOMMANDS) + "} ...\n")
        for name, (_, help) in SUBCOMMANDS.items():
            print(f"  {name:<14} {help}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    fn, _ = SUBCOMMANDS[argv[0]]
    return fn(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
