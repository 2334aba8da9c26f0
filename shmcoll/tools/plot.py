"""`--plot`: bus bandwidth against message size, one line per algorithm, with the
cost model's crossovers marked.  matplotlib is an optional extra (shmcoll[plot])."""


def plot_sweep(rows, path, collective, world, model=None, title=None):
    """rows: perf.Row-like objects (size, algo, busbw_GBs, inplace); writes `path`."""
    from shmcoll.tuning import calibration
    from shmcoll.tuning import selector
    if model is None:
        model = calibration.model_for(world)[0]
    series = {}
    for r in rows:
        if not r.inplace and r.size > 0:
            series.setdefault(r.algo.split(" ")[0], []).append((r.size, r.busbw_GBs))
    rules = selector.describe(world, model, collectives=(collective,))
    crossovers = [(rule.hi + 1, f"modelled crossover {rule.algorithm} -> {after.algorithm}")
                  for rule, after in zip(rules, rules[1:])]
    plot_busbw(series, crossovers, path, title or f"{collective}, {world} ranks")


def plot_busbw(series, crossovers, path, title):
    """series: {label: [(size, busbw GB/s)]}; crossovers: [(size, label)] drawn as
    dashed lines where they fall inside the sizes plotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, points in sorted(series.items()):
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    sizes = [s for points in series.values() for s, _ in points]
    for size, label in crossovers:
        if sizes and min(sizes) <= size <= max(sizes):
            ax.axvline(size, color="grey", linestyle="--", linewidth=1)
            ax.annotate(label, (size, ax.get_ylim()[1]), rotation=90, va="top", ha="right",
                        fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
