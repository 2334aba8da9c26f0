"""`shmcoll bench-compare`: compare two saved pytest-benchmark runs of bench/.

Raw medians move with everything else the machine is doing.  Each benchmark of the
suite also records two references measured right after it, in the same run:
`yardstick_ratio` = median / (a direct broadcast of the same bytes between the same
ranks: the cross-core wake-ups and transfers a collective pays, on a schedule no
setting changes) and `ratio` = median / (a memcpy of the same bytes on one core).
The comparison fails when a benchmark's change, by the chosen measure (default: the
yardstick ratio), exceeds the threshold.
"""
import glob
import json
import os

HELP = "compare saved benchmark runs: raw and normalised changes"


def latest_runs(storage=".benchmarks", count=2):
    """The `count` most recently saved runs (pytest-benchmark's storage layout)."""
    files = sorted(glob.glob(os.path.join(storage, "*", "*.json")), key=os.path.getmtime)
    if len(files) < count:
        raise FileNotFoundError(f"need {count} saved runs in {storage}/ "
                                f"(pytest bench --benchmark-autosave), found {len(files)}")
    return files[-count:]


def load(path):
    with open(path) as f:
        data = json.load(f)
    return {b["name"]: b for b in data["benchmarks"]}


def change(old, new):
    return (new / old - 1.0) * 100.0 if old else float("inf")


MEASURES = {"yardstick": "yardstick_ratio", "memcpy": "ratio", "raw": None}


def best(paths, key, stat):
    """{benchmark: the lowest value of the measure over several runs}: a slow stretch of
    the machine makes a run slower, never faster, so the best of a few runs is what
    the code costs."""
    out = {}
    for path in paths:
        for name, bench in load(path).items():
            v = bench["stats"][stat] if key is None else bench["extra_info"].get(key)
            if v and (name not in out or v < out[name]):
                out[name] = v
    return out


def compare(base_paths, new_paths, threshold, by="yardstick", stat="median"):
    """Rows of (name, {measure: change % or None}, failed) for the benchmarks in both
    sides; each side is one or more runs (best of them per benchmark); `by` names the
    measure that decides failure (raw when it is missing)."""
    if isinstance(base_paths, str):
        base_paths, new_paths = [base_paths], [new_paths]
    base = {m: best(base_paths, k, stat) for m, k in MEASURES.items()}
    new = {m: best(new_paths, k, stat) for m, k in MEASURES.items()}
    rows = []
    for name in sorted(set(base["raw"]) & set(new["raw"])):
        changes = {m: change(base[m][name], new[m][name])
                   if name in base[m] and name in new[m] else None for m in MEASURES}
        decisive = changes[by] if changes[by] is not None else changes["raw"]
        rows.append((name, changes, decisive > threshold))
    return rows


def noise(rows):
    """Median |change| per measure: between two runs of the same code, the noise."""
    out = {}
    for measure in MEASURES:
        vals = sorted(abs(c[measure]) for _, c, _ in rows if c[measure] is not None)
        out[measure] = vals[len(vals) // 2] if vals else None
    return out


def format_rows(rows, threshold, by):
    lines = [f"{'benchmark':<56} {'raw':>8} {'/memcpy':>8} {'/yardstick':>10}"]
    fmt = lambda v: "n/a" if v is None else f"{v:+.1f}%"
    for name, c, failed in rows:
        lines.append(f"{name:<56} {fmt(c['raw']):>8} {fmt(c['memcpy']):>8} "
                     f"{fmt(c['yardstick']):>10}{'  FAIL' if failed else ''}")
    n = noise(rows)
    lines.append("# median |change|: " + ", ".join(
        f"{m} {'n/a' if v is None else f'{v:.1f}%'}" for m, v in n.items()))
    failed = sum(r[2] for r in rows)
    lines.append(f"# {failed} of {len(rows)} benchmarks slower by more than {threshold:g}% "
                 f"({by}{'' if by == 'raw' else '-normalised'})")
    return "\n".join(lines)


def main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="shmcoll bench-compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", metavar="RUN.json",
                   help="baseline and new run (default: the last two in .benchmarks/)")
    p.add_argument("--repeats", type=int, default=1, metavar="K",
                   help="compare the best of the last K saved runs with the best of the K "
                        "before them (default 1)")
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="raw statistic of each run (default median)")
    p.add_argument("--threshold", type=float, default=15.0, help="percent (default 15)")
    p.add_argument("--storage", default=".benchmarks")
    p.add_argument("--by", choices=list(MEASURES), default="yardstick",
                   help="the measure that decides failure (default: yardstick)")
    opts = p.parse_args(argv)
    if len(opts.runs) not in (0, 2) or (opts.runs and opts.repeats != 1) or opts.repeats < 1:
        p.error("give two runs, or none for the last saved ones (--repeats K: the last 2K)")
    try:
        if opts.runs:
            base, new = [opts.runs[0]], [opts.runs[1]]
        else:
            runs = latest_runs(opts.storage, 2 * opts.repeats)
            base, new = runs[:opts.repeats], runs[opts.repeats:]
        rows = compare(base, new, opts.threshold, opts.by, opts.stat)
    except (OSError, KeyError, ValueError) as e:
        p.error(str(e))
    print(f"# baseline {', '.join(base)}\n# new      {', '.join(new)}")
    print(format_rows(rows, opts.threshold, opts.by))
    return 1 if any(r[2] for r in rows) else 0
