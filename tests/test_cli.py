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


def test_info_lists_every_setting():
    from shmcoll.config import SETTINGS
    res = run_cli("info")
    assert res.returncode == 0
    for name in SETTINGS:
        assert name in res.stdout
    assert "ring" in res.stdout
