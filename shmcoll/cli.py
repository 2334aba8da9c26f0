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
    from shmcoll.perf import parse_size
    from shmcoll.selector import COLLECTIVES
    from shmcoll.ops import ReduceOp
    p.add_argument("collective", choices=COLLECTIVES)
    p.add_argument("-np", "--nprocs", dest="np", type=int, default=2, help="number of ranks")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", dest="factor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (0: auto)")
    p.add_argument("-w", "--warmup", type=int, default=-1, help="untimed calls first (-1: auto)")
    p.add_argument("-d", "--datatype", dest="dtype", default="float32")
    p.add_argument("-o", "--op", default="sum", choices=[m.value for m in ReduceOp])
    p.add_argument("--algo", default=None, help="force an algorithm (default: cost model)")
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
    if opts.dtype == "bfloat16":
        import ml_dtypes
        opts.dtype = np.dtype(ml_dtypes.bfloat16)


@subcommand("bench-compare", "compare two saved benchmark runs, normalised by memcpy")
def _bench_compare(argv):
    from shmcoll import benchcmp
    return benchcmp.main(argv)


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
        if not opts.dry_run:
            segment.unlink(name)
        print(f"{'stale' if opts.dry_run else 'removed'} /dev/shm{name}")
    print(f"# {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}"
          f"{' (dry run)' if opts.dry_run else ' removed'}; live jobs untouched")
    return 0


@subcommand("info", "build, settings and algorithms in force")
def _info(argv):
    from shmcoll import config, __version__, _engine
    from shmcoll.algorithms import REGISTRY
    argparse.ArgumentParser(prog="shmcoll info").parse_args(argv)
    print(f"shmcoll {__version__}  engine {_engine.__file__}")
    print(f"dtypes: {', '.join(_engine.SUPPORTED_DTYPES)}")
    print("algorithms:")
    for name, alg in REGISTRY.items():
        print(f"  {name:<8} {alg.DESCRIPTION}  [{', '.join(alg.COLLECTIVES)}]")
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
            print(f"  {name:<10} {help}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    fn, _ = SUBCOMMANDS[argv[0]]
    return fn(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
