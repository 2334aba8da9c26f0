"""`shmcoll bench-compare`: compare two saved pytest-benchmark runs of bench/.

Raw medians move with everything else the machine is doing; each benchmark of the
suite also records `ratio` = median / (memcpy of the same bytes, same run).  The
comparison fails when a benchmark's ratio grew by more than the threshold.
"""
import glob
import json
import os


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


def compare(base_path, new_path, threshold):
    """Rows of (name, raw change %, normalised change % or None, failed) for shared names."""
    base, new = load(base_path), load(new_path)
    rows = []
    for name in sorted(set(base) & set(new)):
        b, n = base[name], new[name]
        raw = change(b["stats"]["median"], n["stats"]["median"])
        rb, rn = b["extra_info"].get("ratio"), n["extra_info"].get("ratio")
        norm = change(rb, rn) if rb and rn else None
        metric = raw if norm is None else norm
        rows.append((name, raw, norm, metric > threshold))
    return rows


def format_rows(rows, threshold):
    lines = [f"{'benchmark':<52} {'raw':>9} {'normalised':>11}",]
    for name, raw, norm, failed in rows:
        norm_s = "n/a" if norm is None else f"{norm:+.1f}%"
        lines.append(f"{name:<52} {raw:>+8.1f}% {norm_s:>11}{'  FAIL' if failed else ''}")
    failed = sum(r[3] for r in rows)
    lines.append(f"# {failed} of {len(rows)} benchmarks slower by more than {threshold:g}% "
                 f"(normalised by a same-size memcpy)")
    return "\n".join(lines)


def main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="shmcoll bench-compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", metavar="RUN.json",
                   help="baseline and new run (default: the last two in .benchmarks/)")
    p.add_argument("--threshold", type=float, default=15.0, help="percent (default 15)")
    p.add_argument("--storage", default=".benchmarks")
    opts = p.parse_args(argv)
    if len(opts.runs) not in (0, 2):
        p.error("give two runs, or none for the last two saved")
    try:
        base, new = opts.runs or latest_runs(opts.storage)
        rows = compare(base, new, opts.threshold)
    except (OSError, KeyError, ValueError) as e:
        p.error(str(e))
    print(f"# baseline {base}\n# new      {new}")
    print(format_rows(rows, opts.threshold))
    return 1 if any(r[3] for r in rows) else 0
