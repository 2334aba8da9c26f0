"""The perf tester and info, run as a user would."""
import json

from procs import run


def run_cli(*args, timeout=300):
    return run("-m", "shmcoll", *args, timeout=timeout)


def test_perf_allreduce_prints_nccl_tests_table_and_json(tmp_path):
    out = tmp_path / "rows.json"
    res = run_cli("perf", "allreduce", "-np", "2", "-b", "8", "-e", "64K", "-f", "8",
                  "-n", "5", "-w", "1", "--json", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("# shmcoll perf allreduce: nranks 2")
    assert any("algbw" in l and "busbw" in l and "#wrong" in l for l in lines)
    assert "# Out of bounds values : 0 OK" in res.stdout
    assert "# Avg bus bandwidth" in res.stdout
    rows = json.loads(out.read_text())
    assert [r["size"] for r in rows if not r["inplace"]] == [8, 64, 512, 4096, 32768]
    for r in rows:
        assert r["wrong"] == 0 and r["time_us"] > 0
        assert abs(r["busbw_GBs"] - r["algbw_GBs"]) < 1e-9      # 2(P-1)/P = 1 at P=2


def test_perf_reduce_scatter_and_allgather_with_other_types():
    for coll, dtype, op in (("reduce_scatter", "int32", "max"), ("allgather", "float16", "sum")):
        res = run_cli("perf", coll, "-np", "3", "-b", "1K", "-e", "256K", "-f", "16",
                      "-n", "3", "-w", "1", "-d", dtype, "-o", op)
        assert res.returncode == 0, res.stderr
        assert "0 OK" in res.stdout


def test_perf_rejects_bad_arguments():
    assert run_cli("perf", "allreduce", "-d", "complex64").returncode == 2
    assert run_cli("perf", "allreduce", "-b", "1M", "-e", "1K").returncode == 2
    assert run_cli("perf", "broadcastx").returncode == 2
    assert run_cli("perf", "allreduce", "-b", "12Q").returncode == 2


def test_perf_sweeps_every_type_and_op_with_nccl_tests_names(tmp_path):
    out = tmp_path / "rows.json"
    res = run_cli("perf", "allreduce", "-np", "2", "-b", "64", "-e", "64", "-n", "2", "-w", "1",
                  "-d", "all", "-o", "all", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "0 OK" in res.stdout and "root" in res.stdout
    rows = json.loads(out.read_text())
    types = {r["dtype"] for r in rows}
    assert {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
            "float64"} <= types
    assert {(r["dtype"], r["op"]) for r in rows} == {(t, o) for t in types
                                                     for o in ("sum", "prod", "max", "min", "avg")}
    assert all(r["root"] == -1 and r["count"] > 0 and r["wrong"] == 0 for r in rows)
    for name in ("float", "half", "double", "int8", "uint64"):
        assert f" {name} " in res.stdout
    res = run_cli("perf", "gather", "-np", "3", "-r", "1", "-b", "96", "-e", "96", "-n", "2",
                  "-d", "double")
    row = [line for line in res.stdout.splitlines() if line.strip().startswith("96")][0]
    assert row.split()[2:5] == ["double", "none", "1"]


def test_perf_refuses_sizes_without_elements_and_says_its_version():
    res = run_cli("perf", "allreduce", "-b", "2", "-e", "64", "-d", "float")
    assert res.returncode == 2 and "holds no float" in res.stderr
    res = run_cli("perf", "reduce_scatter", "-np", "3", "-b", "8", "-e", "64", "-d", "float")
    assert res.returncode == 2 and "whole blocks of 3" in res.stderr
    assert run_cli("perf", "allreduce", "-d", "quad").returncode == 2
    from shmcoll import __version__
    assert run_cli("perf", "--version").stdout.strip() == f"shmcoll perf {__version__}"
    assert run_cli("--version").stdout.strip() == f"shmcoll {__version__}"


def test_info_lists_every_setting():
    from shmcoll._core.settings import SETTINGS
    res = run_cli("info")
    assert res.returncode == 0
    for name in SETTINGS:
        assert name in res.stdout
    assert "ring" in res.stdout


def test_perf_every_collective_with_a_root_checks_out():
    for coll in ("broadcast", "reduce", "gather", "scatter"):
        res = run_cli("perf", coll, "-np", "3", "-r", "2", "-b", "64", "-e", "64K", "-f", "32",
                      "-n", "3", "-w", "1")
        assert res.returncode == 0, (coll, res.stderr)
        assert "root 2" in res.stdout and "0 OK" in res.stdout


def test_perf_algo_all_marks_the_fastest_and_what_auto_picks(tmp_path):
    out = tmp_path / "rows.json"
    res = run_cli("perf", "allreduce", "-np", "2", "-b", "8", "-e", "4K", "-f", "8", "-n", "3",
                  "-w", "1", "--algo", "all", "--json", str(out))
    assert res.returncode == 0, res.stderr
    for name in ("ring", "direct", "tree", "rhd", "naive"):
        assert f"algo {name}" in res.stdout
    table = res.stdout.split("* = fastest")[1].splitlines()
    assert "auto picks" in table[1]
    assert sum("*" in line for line in table[2:]) == 4            # sizes 8, 64, 512, 4096
    swept = {r["algo"].split(" ")[0] for r in json.loads(out.read_text())}
    # cma too where the ranks may read each other's memory (the probe at creation)
    assert swept - {"cma"} == {"ring", "direct", "tree", "rhd", "naive"}


def test_perf_refuses_bad_roots_and_algorithms():
    assert run_cli("perf", "broadcast", "-np", "2", "-r", "2").returncode == 2
    res = run_cli("perf", "broadcast", "--algo", "rhd")
    assert res.returncode == 2 and "not an algorithm of broadcast" in res.stderr


def test_perf_plot_needs_matplotlib_or_says_so(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        res = run_cli("perf", "allreduce", "-np", "2", "-e", "64", "--plot", str(tmp_path / "p.png"))
        assert res.returncode == 2 and "matplotlib" in res.stderr
        return
    png = tmp_path / "p.png"
    res = run_cli("perf", "allreduce", "-np", "2", "-b", "8", "-e", "64K", "-f", "64", "-n", "2",
                  "-w", "0", "--algo", "all", "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_calibrate_dry_run_fits_and_prints_decisions(tmp_path):
    res = run("-m", "shmcoll", "calibrate", "-np", "2", "--quick", "--dry-run", timeout=600,
              SHMCOLL_CALIBRATION=str(tmp_path / "cal.json"))
    assert res.returncode == 0, res.stderr
    assert "alpha us" in res.stdout and "rms err" in res.stdout
    assert all(c in res.stdout for c in ("allreduce ", "broadcast ", "scatter "))
    assert "decisions: allreduce:" in res.stdout
    assert not (tmp_path / "cal.json").exists()


def test_calibrate_pools_runs_by_the_median_of_each_point():
    from shmcoll.tools.calibrate import pooled
    runs = [[("allreduce", "ring", "ring", 64, t), ("allreduce", "rhd", "doubling", 64, 2.0)]
            for t in (1.0, 9.0, 3.0)]
    assert sorted(pooled(runs)) == [("allreduce", "rhd", "doubling", 64, 2.0),
                                    ("allreduce", "ring", "ring", 64, 3.0)]


def test_calibrate_with_runs_saves_the_pooled_fit(tmp_path):
    res = run("-m", "shmcoll", "calibrate", "-np", "2", "--quick", "--runs", "2", timeout=600,
              SHMCOLL_CALIBRATION=str(tmp_path / "cal.json"))
    assert res.returncode == 0, res.stderr
    assert "2 runs" in res.stdout and "saved to" in res.stdout
    (entry,) = json.loads((tmp_path / "cal.json").read_text())["machines"].values()
    assert entry["2"]["runs"] == 2 and "allreduce" in entry["2"]["collectives"]
    assert run("-m", "shmcoll", "calibrate", "--runs", "0").returncode == 2


def test_info_prints_calibration_and_decisions_in_the_override_grammar(tmp_path):
    from shmcoll.tuning import selector
    res = run_cli("info", "-np", "3")
    assert res.returncode == 0, res.stderr
    line = next(l for l in res.stdout.splitlines() if "decisions:" in l)
    rules = selector.parse_overrides(line.split("decisions:")[1].strip())
    assert rules.lookup("allreduce", 8) is not None
    assert "P=3: default" in res.stdout and "calibration file" in res.stdout


def test_debug_log_names_every_candidate():
    code = ("import shmcoll, workers\n"
            "if __name__ == '__main__':\n    shmcoll.launch(workers.two_decisions, 2)\n")
    res = run("-c", code, SHMCOLL_DEBUG="INFO")
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stderr.splitlines() if "allreduce 4096 B P=2" in l]
    assert len(lines) == 2                                  # once per rank
    for name in ("ring", "direct", "tree", "rhd", "naive"):
        assert name in lines[0]
    assert any("broadcast 24 B P=2" in l for l in res.stderr.splitlines())


def test_perf_symmetric_sweeps_single_copy_and_checks_out(tmp_path):
    out = tmp_path / "rows.json"
    for coll in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather"):
        res = run_cli("perf", coll, "-np", "3", "-b", "1K", "-e", "1M", "-f", "32", "-n", "3",
                      "-w", "1", "--symmetric", "--algo", "all", "--json", str(out))
        assert res.returncode == 0, (coll, res.stderr)
        assert "0 OK" in res.stdout and "algo symmetric" in res.stdout, coll
        rows = json.loads(out.read_text())
        assert all(r["wrong"] == 0 for r in rows)
        assert any(r["algo"].startswith("symmetric") for r in rows), coll
    res = run_cli("perf", "allreduce", "--algo", "symmetric")
    assert res.returncode == 2 and "--symmetric" in res.stderr
