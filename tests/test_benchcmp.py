"""`shmcoll bench-compare` on synthetic pytest-benchmark files."""
import json

import pytest

from shmcoll.tools import bench_compare as benchcmp


def _run(path, medians, yard=None, mins=None):
    benchmarks = [{"name": n, "stats": {"median": m, "min": (mins or medians)[n]},
                   "extra_info": {"ratio": m / 1e-6, "yardstick_ratio": m / (yard or {}).get(n, m)}}
                  for n, m in medians.items()]
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    return str(path)


def test_failure_is_decided_by_the_chosen_measure(tmp_path):
    base = _run(tmp_path / "a.json", {"x": 1.0, "y": 1.0}, yard={"x": 1.0, "y": 1.0})
    # the whole machine got 50% slower: raw says +50%, the yardstick moved with it
    new = _run(tmp_path / "b.json", {"x": 1.5, "y": 3.0}, yard={"x": 1.5, "y": 1.5})
    rows = {name: (changes, failed) for name, changes, failed in
            benchcmp.compare(base, new, 15, by="yardstick")}
    assert rows["x"][0]["raw"] == 50.0 and rows["x"][0]["yardstick"] == 0.0
    assert not rows["x"][1] and rows["y"][1]
    raw = {name: failed for name, _, failed in benchcmp.compare(base, new, 15, by="raw")}
    assert raw == {"x": True, "y": True}


def test_best_of_several_runs_per_side(tmp_path):
    a1 = _run(tmp_path / "a1.json", {"x": 2.0})          # a slow stretch
    a2 = _run(tmp_path / "a2.json", {"x": 1.0})
    b1 = _run(tmp_path / "b1.json", {"x": 1.05})
    b2 = _run(tmp_path / "b2.json", {"x": 3.0})
    [(name, changes, failed)] = benchcmp.compare([a1, a2], [b1, b2], 15, by="raw", stat="min")
    assert abs(changes["raw"] - 5.0) < 1e-9 and not failed


def test_cli_reads_the_last_runs_and_exits_1_on_a_regression(tmp_path):
    store = tmp_path / "store" / "Linux-CPython"
    store.mkdir(parents=True)
    import os
    import time
    for i, m in enumerate([1.0, 1.0, 1.0, 2.0]):
        p = _run(store / f"{i:04d}_run.json", {"x": m})
        os.utime(p, (time.time() + i, time.time() + i))
    assert benchcmp.main(["--storage", str(tmp_path / "store"), "--by", "raw"]) == 1
    # best of the last two (1.0, 2.0) against best of the two before: no regression
    assert benchcmp.main(["--storage", str(tmp_path / "store"), "--by", "raw",
                          "--repeats", "2"]) == 0
    first_two = [str(store / "0000_run.json"), str(store / "0001_run.json")]
    assert benchcmp.main(first_two + ["--by", "raw"]) == 0


class ScriptedSide:
    """A bench-ab side whose timings are given: (median seconds, algorithm) per request."""

    def __init__(self, name, medians, algorithm, log):
        self.name, self.medians, self.algorithm, self.log = name, list(medians), algorithm, log

    def time(self, request):
        self.log.append(self.name)
        return {"median": self.medians.pop(0), "algorithm": self.algorithm}


def test_bench_ab_interleaves_pairs_and_takes_the_median_ratio():
    from shmcoll.tools import bench_ab as abtest
    log = []
    a = ScriptedSide("A", [1.0, 1.0, 2.0, 1.0, 1.0], "ring", log)
    b = ScriptedSide("B", [1.1, 1.3, 2.4, 5.0, 0.9], "naive", log)
    case = {"collective": "allreduce", "algo": None, "nbytes": 4096, "world": 3}
    (ratio, ratios, algo_a, algo_b), = abtest.compare([case], [a, b], 5).values()
    assert log == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]    # neither always first
    assert ratios == pytest.approx([1.1, 1.3, 1.2, 5.0, 0.9])
    assert ratio == pytest.approx(1.2) and (algo_a, algo_b) == ("ring", "naive")


@pytest.mark.parametrize("ratios,flagged", [
    ([1.0, 1.02, 0.98, 1.01, 3.0, 1.0, 0.99], False),     # one unlucky pair never flags
    ([1.3, 1.25, 1.4, 0.9, 1.3, 1.35, 1.3], True),        # three quarters of the pairs do
    ([1.16, 1.16, 1.16, 1.16], True),
    ([1.14, 1.14, 1.14, 1.14], False),                    # below the threshold
])
def test_bench_ab_flags_by_the_lower_quartile(ratios, flagged):
    from shmcoll.tools import bench_ab as abtest
    assert abtest.slower(ratios, 15.0) is flagged


def test_bench_ab_exit_status_and_report_follow_the_flags(tmp_path, monkeypatch, capsys):
    """A setting that slows one benchmark (B 1.5x on every pair) and not another: only
    that one is flagged, and the run exits 1."""
    from shmcoll.tools import bench_ab as abtest
    timings = {"allreduce-auto-4096B-2": (1.0, 1.5), "allreduce-ring-4096B-2": (1.0, 1.0)}

    class Side:
        def __init__(self, name, world, python, env):
            self.side = 1 if env.get("SHMCOLL_ALGO") else 0

        def time(self, request):
            name = abtest._name(request)
            algo = request["algo"] or ("naive" if self.side else "ring")
            return {"median": timings.get(name, (1.0, 1.0))[self.side], "algorithm": algo}

        def close(self):
            pass
    monkeypatch.setattr(abtest, "Side", Side)
    out = tmp_path / "ab.json"
    code = abtest.main(["-np", "2", "--collectives", "allreduce", "--sizes", "4K", "--pairs", "4",
                        "--b-env", "SHMCOLL_ALGO=allreduce:naive", "--json", str(out)])
    results = json.loads(out.read_text())
    assert code == 1
    assert results["allreduce-auto-4096B-2"]["ratio"] == pytest.approx(1.5)
    assert results["allreduce-auto-4096B-2"]["b"] == "naive"
    lines = capsys.readouterr().out.splitlines()
    flagged = [line.split()[0] for line in lines if line.endswith("SLOWER")]
    assert flagged == ["allreduce-auto-4096B-2"]


def test_bench_ab_runs_two_live_sides(tmp_path):
    """Two live sides start, answer every benchmark and report the algorithm each ran
    (the timings themselves are not judged here: bench/ab_demo.py shows them)."""
    from procs import run
    out = tmp_path / "ab.json"
    res = run("-m", "shmcoll", "bench-ab", "-np", "3", "--collectives", "allreduce",
              "--sizes", "4K", "--pairs", "2", "--b-env", "SHMCOLL_ALGO=allreduce:naive",
              "--json", str(out), timeout=300)
    assert res.returncode in (0, 1), res.stderr       # 1: a benchmark was flagged slower
    results = json.loads(out.read_text())
    assert set(results) == {f"allreduce-{a}-4096B-3" for a in
                            ("ring", "direct", "tree", "rhd", "naive", "auto")}
    assert results["allreduce-auto-4096B-3"]["b"] == "naive"
    assert results["allreduce-ring-4096B-3"]["a"] == results["allreduce-ring-4096B-3"]["b"] == "ring"
    assert all(len(r["pairs"]) == 2 and r["ratio"] > 0 for r in results.values())


def test_bench_ab_reports_a_side_that_fails_to_start_at_once():
    """A side that cannot start (here: a setting its ranks refuse) ends the run with
    the reason, instead of leaving the driver waiting out its mirrors' join timeout."""
    from procs import run
    res = run("-m", "shmcoll", "bench-ab", "-np", "2", "--collectives", "allreduce",
              "--sizes", "8", "--pairs", "1", "--a-env", "SHMCOLL_TIMEOUT=600",
              "--b-env", "SHMCOLL_ALGO=allreduce:nosuch", "SHMCOLL_TIMEOUT=600", timeout=120)
    assert res.returncode == 2, res.stderr
    assert "side B exited" in res.stderr and "nosuch" in res.stderr


def test_bench_ab_refuses_bad_settings():
    from procs import run
    res = run("-m", "shmcoll", "bench-ab", "--b-env", "SHMCOLL_ALGO")
    assert res.returncode == 2 and "NAME=VALUE" in res.stderr
