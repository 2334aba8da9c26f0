"""`shmcoll perf`: an nccl-tests style throughput tester.

Conventions (nccl-tests): columns size, count, type, redop, root (-1 for collectives
without one), then time, algbw, busbw and #wrong out of place and in place; -d takes
nccl-tests' type names (float, half, double, bfloat16, int8, ..., or all) as well as
numpy's, -o all sweeps sum, prod, max, min and avg.  Size is the bytes of the full
vector (allreduce, reduce,
broadcast: x; reduce_scatter: x on each rank; allgather, gather: the gathered
output; scatter: the root's x; alltoall: x on each rank); time is the max over ranks of the mean per-call
time; algbw = size / time; busbw = algbw x 2(P-1)/P for allreduce, x 1 for broadcast,
reduce and sendrecv, x (P-1)/P for the others (alltoall included).  Broadcast is
always in place, so its two columns time the same call; alltoall and sendrecv have no
in-place form, so theirs time the out-of-place call again.  sendrecv is nccl-tests'
ring shift: every rank sends x to r+1 while receiving from r-1 (size: x).
"""
import argparse
import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

from shmcoll.collectives import BY_NAME, PERF_NAMES, ROOTED, SENDRECV, bus_factor
from shmcoll.tools.harness import Case, auto_iters, size_sweep, time_calls

HELP = "throughput tester in the style of nccl-tests"


@dataclass
class Row:
    collective: str
    world: int
    size: int
    count: int
    dtype: str
    op: str
    algo: str
    inplace: bool
    time_us: float
    algbw_GBs: float
    busbw_GBs: float
    wrong: int
    root: int = -1


# nccl-tests' names of types (-d), and the order of `-d all`; numpy's names work too.
NCCL_TYPES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
              "int64": "int64", "uint64": "uint64", "half": "float16", "float": "float32",
              "double": "float64", "bfloat16": "bfloat16"}
ALL_OPS = ("sum", "prod", "max", "min", "avg")      # nccl-tests' -o all


def run_size(comm, collective, nbytes, dtype, op, algo, iters, warmup, check, inplace, root=0,
             device=False, symmetric=False):
    case = Case(comm, collective, nbytes, dtype, op, algo, root, device, symmetric)
    n = iters or auto_iters(case.nbytes)
    if warmup < 0:
        warmup = max(2, n // 10) + _settling_calls(comm, case, algo, device, symmetric, inplace)
    seconds = time_calls(comm, case.call(inplace), n, warmup)
    wrong = case.check(inplace) if check else 0
    wrong = int(comm.allreduce(np.array([wrong], np.int64))[0])
    algbw = case.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    if collective == SENDRECV.name:
        chosen = "p2p"
    elif symmetric:
        chosen = comm.algorithm_for(collective, case.nbytes, algo,
                                    symmetric=_out_case(collective, inplace))
    else:
        chosen = comm.algorithm_for(collective, case.nbytes, algo, device=device)
    return Row(collective, comm.world_size, case.nbytes, case.count, str(case.dtype),
               op if BY_NAME[collective].reducing else "none", chosen, inplace, seconds * 1e6,
               algbw, algbw * bus_factor(collective, comm.world_size), wrong,
               root if collective in ROOTED else -1)


def _settling_calls(comm, case, algo, device, symmetric, inplace):
    """Calls before auto's choice for the size is final (a trial's candidates run
    first): warm-up, or the timed loop would mix the candidates' times."""
    if case.collective == SENDRECV.name:
        return 0
    where = _out_case(case.collective, inplace) if symmetric else None
    return comm.calls_until_settled(case.collective, case.nbytes, algo, device=device,
                                    symmetric=where)


TYPE_NAMES = {numpy: nccl for nccl, numpy in NCCL_TYPES.items()}


def _out_case(collective, inplace):
    """Where out lies in a --symmetric sweep (x and out both symmetric)."""
    return "in place" if inplace and collective == "allreduce" else "symmetric"


def header(opts, algo):
    root = f"  root {opts.root}" if opts.collective in ROOTED else ""
    return "\n".join([
        f"# shmcoll perf {opts.collective}: nranks {opts.np}  minBytes {opts.minbytes}  "
        f"maxBytes {opts.maxbytes}  step factor {opts.factor:g}  iters {opts.iters or 'auto'}  "
        f"warmup {opts.warmup if opts.warmup >= 0 else 'auto'}  check {int(opts.check)}  "
        f"dtype {opts.dtype}  op {opts.op}  algo {algo or 'auto'}{root}"
        f"{'  device cuda' if getattr(opts, 'device', 'cpu') == 'cuda' else ''}",
        "#",
        f"# {'':>44}{'out-of-place':>27}{'in-place':>35}",
        f"# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} {'time':>9} "
        f"{'algbw':>7} {'busbw':>7} {'#wrong':>6}  {'time':>9} {'algbw':>7} {'busbw':>7} "
        f"{'#wrong':>6}  algorithm",
        f"# {'(B)':>10} {'(elements)':>12} {'':>9} {'':>6} {'':>5} {'(us)':>9} {'(GB/s)':>7} "
        f"{'(GB/s)':>7} {'':>6}  {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}",
    ])


def format_row(oop, inp):
    t = TYPE_NAMES.get(oop.dtype, oop.dtype)
    return (f"  {oop.size:>10} {oop.count:>12} {t:>9} {oop.op:>6} {oop.root:>5} "
            f"{oop.time_us:>9.2f} {oop.algbw_GBs:>7.2f} {oop.busbw_GBs:>7.2f} {oop.wrong:>6}  "
            f"{inp.time_us:>9.2f} {inp.algbw_GBs:>7.2f} {inp.busbw_GBs:>7.2f} {inp.wrong:>6}  {oop.algo}")


def footer(rows):
    wrong = sum(r.wrong for r in rows)
    avg = sum(r.busbw_GBs for r in rows) / len(rows) if rows else 0.0
    return "\n".join([f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
                      f"# Avg bus bandwidth    : {avg:.4g}", "#"])


def comparison(rows_by_algo, auto_choice):
    """`--algo all`: out-of-place time per algorithm and size, the fastest marked *,
    and what auto picks for that size."""
    names = list(rows_by_algo)
    lines = ["# out-of-place time (us) per algorithm; * = fastest",
             f"# {'size':>10} " + " ".join(f"{n:>12}" for n in names) + "  auto picks"]
    for i, first in enumerate(rows_by_algo[names[0]][::2]):
        times = {n: rows_by_algo[n][2 * i].time_us for n in names}
        best = min(times, key=times.get)
        cells = " ".join(f"{times[n]:>11.2f}{'*' if n == best else ' '}" for n in names)
        lines.append(f"  {first.size:>10} {cells}  {auto_choice(first.size)}")
    return "\n".join(lines + ["#"])


def _progress(done, total, what):
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r# {done}/{total} sizes ({what})", end=end, file=sys.stderr, flush=True)


def sweep_worker(comm, opts):
    """Runs on every rank; rank 0 prints as it goes.  Returns rows (rank 0) or None."""
    from shmcoll.tuning.selector import algorithms_for
    device = getattr(opts, "device", "cpu") == "cuda"
    symmetric = getattr(opts, "symmetric", False)
    cross_memory = getattr(comm, "cross_memory", None) is not None
    algos = algorithms_for(opts.collective, single_copy=symmetric, cross_memory=cross_memory) \
        if opts.algo == "all" else [opts.algo]
    if getattr(opts, "mpi", False) and opts.algo == "all":
        algos = comm.compositions(opts.collective)
    if device and opts.algo == "all":
        from shmcoll.cuda.path import VARIANTS
        algos = list(VARIANTS.get(opts.collective, ())) or [None]
    sizes = size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    rows, by_algo, lead = [], {}, comm.rank == 0
    points = [(dtype, op, nbytes) for dtype in opts.dtypes for op in opts.ops
              for nbytes in sizes]
    for algo in algos:
        if lead:
            print(header(opts, algo), flush=True)
        block = []
        for k, (dtype, op, nbytes) in enumerate(points):
            pair = [run_size(comm, opts.collective, nbytes, dtype, op, algo,
                             opts.iters, opts.warmup, opts.check, inplace, opts.root, device,
                             symmetric)
                    for inplace in (False, True)]
            block.extend(pair)
            if lead:
                print(format_row(*pair), flush=True)
                _progress(k + 1, len(points), algo or "auto")
        if lead:
            print(footer(block), flush=True)
        rows.extend(block)
        by_algo[algo or "auto"] = block
    if lead and len(algos) > 1:
        print(comparison(by_algo, lambda n: comm.algorithm_for(opts.collective, _sized(comm, opts, n),
                                                               device=device)),
              flush=True)
    return rows if lead else None


def _sized(comm, opts, nbytes):
    """The size a sweep point really has, for the first type swept."""
    return elements(opts.collective, nbytes, opts.dtypes[0], comm.world_size) * \
        np.dtype(opts.dtypes[0]).itemsize


def elements(collective, nbytes, dtype, world):
    """The elements a sweep point of nbytes holds (blocked collectives round down to
    whole blocks of the world size)."""
    count = nbytes // np.dtype(dtype).itemsize
    if BY_NAME[collective].blocked:
        count -= count % world
    return count


def run(opts):
    """Launch opts.np ranks, sweep, print; returns the process exit status.  With
    --mpi this process is one rank of an MPI job (mpirun started them all): the
    sweep runs on shmcoll.mpi.Communicator and rank 0 prints and writes the files."""
    if opts.mpi:
        return run_mpi(opts)
    from shmcoll.launch import launch
    rows = launch(sweep_worker, opts.np, args=(opts,), bind=getattr(opts, "bind", None))[0]
    return report(opts, rows)


def run_mpi(opts):
    import shmcoll.mpi
    with shmcoll.mpi.Communicator() as comm:
        if comm.rank == 0:
            print(f"# shmcoll.mpi: {comm.world_size} ranks on {comm.nodes} node(s) of "
                  f"{sorted({len(m) for m in comm.members})} rank(s)"
                  f"{'; ' + comm.cluster.describe() if comm.cluster else ''}", flush=True)
        rows = sweep_worker(comm, opts)
        wrong = comm.broadcast_object(report(opts, rows) if comm.rank == 0 else None)
    return wrong


def report(opts, rows):
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    if opts.plot:
        from shmcoll.tools.plot import plot_sweep
        plot_sweep(rows, opts.plot, opts.collective, opts.np)
        print(f"# plot written to {opts.plot}")
    return 1 if any(r.wrong for r in rows) else 0


def add_arguments(p):
    from shmcoll._core.sizes import parse_size
    from shmcoll.ops import ReduceOp
    p.add_argument("collective", choices=PERF_NAMES)
    p.add_argument("-np", "--nprocs", dest="np", type=int, default=2, help="number of ranks")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", dest="factor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=0, help="timed calls per size (0: auto)")
    p.add_argument("-w", "--warmup", type=int, default=-1,
                   help="untimed calls first (-1: auto: a tenth of the timed ones, and the "
                        "calls auto's trial of the size still makes, see "
                        "Communicator.calls_until_settled)")
    p.add_argument("-d", "--datatype", dest="dtype", default="float",
                   help="float, half, double, bfloat16, int8, uint8, int32, uint32, int64, "
                        "uint64 (nccl-tests' names), numpy's names, or all")
    p.add_argument("-o", "--op", default="sum", choices=[m.value for m in ReduceOp] + ["all"],
                   help="reduction op of reducing collectives; all: sum prod max min avg")
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
    p.add_argument("--mpi", action="store_true",
                   help="run as one rank of an MPI job on shmcoll.mpi.Communicator "
                        "(mpirun -np N shmcoll perf --mpi ...; -np is MPI's); --algo takes "
                        "hierarchical, leader, flat, auto or all")
    p.add_argument("--symmetric", action="store_true",
                   help="x and out in symmetric allocations (Communicator.empty), so the "
                        "single-copy schedules compete")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    from shmcoll import __version__
    p.add_argument("--version", action="version", version=f"shmcoll perf {__version__}")


def _types(parser, name):
    """The numpy dtype names -d names (nccl-tests' or numpy's; all)."""
    from shmcoll import _engine
    if name == "all":
        names = list(NCCL_TYPES.values()) + [t for t in _engine.SUPPORTED_DTYPES
                                            if t not in NCCL_TYPES.values()]
        if "bfloat16" in names:
            try:
                import ml_dtypes  # noqa: F401
            except ImportError:
                names.remove("bfloat16")
        return names
    numpy_name = NCCL_TYPES.get(name, name)
    if numpy_name not in _engine.SUPPORTED_DTYPES:
        parser.error(f"unsupported type {name}; supported: {', '.join(NCCL_TYPES)}, all "
                     f"(or numpy's names: {', '.join(_engine.SUPPORTED_DTYPES)})")
    return [numpy_name]


def _as_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return name


def validate(parser, opts):
    if opts.mpi:
        _validate_mpi(parser, opts)
    if opts.np < 1:
        parser.error("-np must be >= 1")
    opts.dtypes = _types(parser, opts.dtype)
    opts.ops = list(ALL_OPS) if opts.op == "all" else [opts.op]
    if not BY_NAME[opts.collective].reducing:
        opts.ops = opts.ops[:1]         # (copies have no op: one pass)
    try:
        sizes = size_sweep(opts.minbytes, opts.maxbytes, opts.factor)
    except ValueError as e:
        parser.error(str(e))
    for dtype in opts.dtypes:
        empty = [n for n in sizes if n and not elements(opts.collective, n, _as_dtype(dtype),
                                                        opts.np)]
        if empty:
            unit = f"{np.dtype(_as_dtype(dtype)).itemsize}-byte elements"
            if BY_NAME[opts.collective].blocked:
                unit = f"whole blocks of {opts.np} {unit}"
            parser.error(f"size {empty[0]} B holds no {TYPE_NAMES.get(dtype, dtype)} data for "
                         f"{opts.collective} (it counts in {unit}); start the sweep at a "
                         f"larger -b")
    if not 0 <= opts.root < opts.np:
        parser.error(f"-r/--root must be in [0, {opts.np})")
    if opts.algo == "auto":
        opts.algo = None
    if opts.symmetric and (opts.mpi or opts.device == "cuda"):
        parser.error("--symmetric: symmetric allocations are the CPU engine's (no --mpi, "
                     "no --device cuda)")
    if opts.algo not in (None, "all") and not opts.mpi:
        from shmcoll.tuning.selector import algorithms_for
        known = algorithms_for(opts.collective, single_copy=opts.symmetric, cross_memory=True)
        if opts.algo not in known:
            parser.error(f"--algo {opts.algo}: not an algorithm of {opts.collective}"
                         f"{' on ordinary arrays (see --symmetric)' if not opts.symmetric else ''}; "
                         f"choose from {', '.join(known + ['auto', 'all'])}")
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
    opts.dtypes = [_as_dtype(t) for t in opts.dtypes]


def _validate_mpi(parser, opts):
    """--mpi: the world is MPI's; the collective and --algo must be ones it runs."""
    try:
        from mpi4py import MPI
    except ImportError:
        parser.error("--mpi needs mpi4py and an MPI (pip install 'shmcoll[mpi]' mpich)")
    from shmcoll.mpi.schedules import RUNS
    opts.np = MPI.COMM_WORLD.Get_size()
    if opts.collective not in RUNS:
        parser.error(f"--mpi: {opts.collective} is not a collective of shmcoll.mpi; choose "
                     f"from {', '.join(RUNS)}")
    names = list(RUNS[opts.collective]) + ["node", "auto", "all"]
    if opts.algo is not None and opts.algo not in names:
        parser.error(f"--mpi --algo {opts.algo}: choose from {', '.join(names)}")
    if opts.device != "cpu" or opts.bind:
        parser.error("--mpi: numpy arrays only, placed by mpirun (no --device, --bind)")


def main(argv):
    p = argparse.ArgumentParser(prog="shmcoll perf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    opts = p.parse_args(argv)
    validate(p, opts)
    return run(opts)
