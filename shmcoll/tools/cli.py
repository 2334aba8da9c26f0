"""The `shmcoll` command: a registry of subcommands, each a module of shmcoll.tools
with a one-line HELP and its own main(argv) (imported only when it runs)."""
import importlib
import sys

SUBCOMMANDS = {     # name -> module
    "perf": "shmcoll.tools.perf",
    "bench-compare": "shmcoll.tools.bench_compare",
    "bench-ab": "shmcoll.tools.bench_ab",
    "cleanup": "shmcoll.tools.cleanup",
    "calibrate": "shmcoll.tools.calibrate",
    "simulate": "shmcoll.tools.simulate",
    "info": "shmcoll.tools.info",
    "run": "shmcoll.tools.run",
}


def _usage():
    lines = ["usage: shmcoll {" + ",".join(SUBCOMMANDS) + "} ...", ""]
    for name, module in SUBCOMMANDS.items():
        lines.append(f"  {name:<14} {importlib.import_module(module).HELP}")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:
        from shmcoll import __version__
        print(f"shmcoll {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        print(_usage())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
