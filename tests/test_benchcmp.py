"""`shmcoll bench-compare` on synthetic pytest-benchmark files."""
import json

from shmcoll import benchcmp


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


def test_bench_ab_flags_only_what_a_setting_slowed(tmp_path):
    """Two live sides interleaved: forcing allreduce onto the naive schedule is seen on
    the automatic allreduce, and the same fixed algorithm on both sides is not flagged
    as slower by a setting that does not touch it."""
    from procs import run
    out = tmp_path / "ab.json"
    res = run("-m", "shmcoll", "bench-ab", "-np", "3", "--collectives", "allreduce",
              "--sizes", "4K", "--pairs", "3", "--threshold", "1000",
              "--b-env", "SHMCOLL_ALGO=allreduce:naive", "--json", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    results = json.loads(out.read_text())
    assert set(results) == {f"allreduce-{a}-4096B-3" for a in
                            ("ring", "direct", "tree", "rhd", "naive", "auto")}
    assert results["allreduce-auto-4096B-3"]["b"] == "naive"
    assert results["allreduce-ring-4096B-3"]["a"] == results["allreduce-ring-4096B-3"]["b"] == "ring"
    assert all(len(r["pairs"]) == 3 and r["ratio"] > 0 for r in results.values())


def test_bench_ab_refuses_bad_settings():
    from procs import run
    res = run("-m", "shmcoll", "bench-ab", "--b-env", "SHMCOLL_ALGO")
    assert res.returncode == 2 and "NAME=VALUE" in res.stderr
