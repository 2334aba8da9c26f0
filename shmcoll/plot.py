"""`--plot`: bus bandwidth against message size, one line per algorithm, with the
cost model's crossovers marked.  matplotlib is an optional extra (shmcoll[plot])."""


def plot_sweep(rows, path, collective, world, model=None, title=None):
    """rows: perf.Row-like objects (size, algo, busbw_GBs, inplace); writes `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shmcoll import calibration, selector
    if model is None:
        model = calibration.model_for(world)[0]
    fig, ax = plt.subplots(figsize=(8, 5))
    series = {}
    for r in rows:
        if not r.inplace and r.size > 0:
            series.setdefault(r.algo.split(" ")[0], []).append((r.size, r.busbw_GBs))
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    sizes = [r.size for r in rows if r.size > 0]
    rules = selector.describe(world, model, collectives=(collective,))
    for rule, after in zip(rules, rules[1:]):
        if sizes and min(sizes) <= rule.hi + 1 <= max(sizes):
            ax.axvline(rule.hi + 1, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"modelled crossover {rule.algorithm} -> {after.algorithm}",
                        (rule.hi + 1, ax.get_ylim()[1]), rotation=90, va="top", ha="right",
                        fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title or f"{collective}, {world} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
