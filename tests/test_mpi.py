"""shmcoll.mpi: the hierarchical communicator under a real mpiexec (MPICH's Hydra
from the test extra), one machine playing several nodes through SHMCOLL_NODE: every
collective x dtype x op against numpy with one node, two equal nodes, uneven nodes,
nodes of one rank (pure MPI) and nodes whose ranks interleave; every composition,
blocking and nonblocking; split at P = 1..8; a rank that fails makes every rank raise,
a rank that dies ends the job, and neither hangs nor leaves a shared-memory entry."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import procs
from shmcoll._core import segment

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
if MPIEXEC is None:
    pytest.skip("no mpiexec", allow_module_level=True)

# layout: SHMCOLL_NODE of each rank; nodes: how many the communicator must find
LAYOUTS = [("0,0", 1), ("0,1", 2), ("0,0,1", 2), ("0,1,2", 3), ("0,0,0,0", 1),
           ("0,0,1,1", 2), ("0,0,0,1", 2), ("1,0,1,0", 2), ("0,1,0,1", 2)]
SPLIT_LAYOUTS = ["0", "0,1", "0,0,1", "0,1,0,1", "0,0,0,1,1", "0,0,0,1,1,1",
                 "0,1,0,1,0,1,0", "0,0,0,0,1,1,1,1"]


def mpiexec(layout, mode, timeout=300):
    n = len(layout.split(","))
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "mpi_rank.py", layout, mode],
                          capture_output=True, text=True, timeout=timeout,
                          env=procs.python_env(), cwd=procs.HERE)


def lines_of(res):
    return [json.loads(s) for s in res.stdout.splitlines() if s.startswith("{")]


def assert_clean_run(res, layout, nodes=None):
    assert res.returncode == 0, res.stderr[-3000:]
    lines = lines_of(res)
    assert sorted(line["rank"] for line in lines) == list(range(len(layout.split(","))))
    for line in lines:
        assert line["problems"] == [], line
        assert nodes is None or line["nodes"] == nodes, line
    return lines


@pytest.mark.parametrize("layout,nodes", LAYOUTS)
def test_every_collective_dtype_and_op_against_numpy(layout, nodes):
    lines = assert_clean_run(mpiexec(layout, "grid"), layout, nodes)
    assert min(line["checked"] for line in lines) > 500


@pytest.mark.parametrize("layout,nodes", LAYOUTS)
def test_every_composition_blocking_and_nonblocking(layout, nodes):
    lines = assert_clean_run(mpiexec(layout, "algos"), layout, nodes)
    assert min(line["checked"] for line in lines) > 100


@pytest.mark.parametrize("layout", SPLIT_LAYOUTS)
def test_split_by_colors_and_keys(layout):
    assert_clean_run(mpiexec(layout, "split"), layout)


@pytest.mark.parametrize("layout", ["0,0,1,1", "0,0,0,1", "0,1,0,1"])
def test_a_rank_that_fails_makes_every_rank_raise(layout):
    """The last rank leaves its node's job mid-run: its node's peers learn it from the
    engine, the other nodes' ranks from the failure notice, well before the timeout."""
    before = set(segment.list_entries())
    res = mpiexec(layout, "leave", timeout=120)      # a hang fails here
    lines = {line["rank"]: line for line in lines_of(res)}
    last = len(layout.split(",")) - 1
    assert sorted(lines) == list(range(last + 1)), res.stdout + res.stderr[-3000:]
    assert lines[last]["raised"] == "ClosedError"
    for rank in range(last):     # from the engine or a notice, whichever came first
        assert lines[rank]["raised"] == "PeerLostError", lines[rank]
        assert "failed" in lines[rank]["message"], lines[rank]
    # the first to learn learned from rank 3 itself, and says so in this communicator's
    # ranks (a notice names rank 3; the engine its local number and which rank that is);
    # the others may learn from a rank that failed in turn
    assert any("rank 3 failed" in lines[r]["message"] or "is rank 3]" in lines[r]["message"]
               for r in range(last)), lines
    assert set(segment.list_entries()) <= before


def test_arrays_that_differ_between_nodes_are_refused_on_every_rank():
    """Each node agrees inside itself, the nodes do not: the leaders' check between
    nodes raises MismatchError, and their nodes' ranks learn it (no hang, no garbage)."""
    res = mpiexec("0,0,1,1", "mismatch", timeout=120)
    lines = {line["rank"]: line for line in lines_of(res)}
    assert sorted(lines) == [0, 1, 2, 3], res.stdout + res.stderr[-3000:]
    for line in lines.values():
        assert line["raised"] in ("MismatchError", "PeerLostError"), line
        if line["leader"]:
            assert line["raised"] == "MismatchError" and "differ between nodes" in line["message"]


def mpich_files():
    return {f for f in os.listdir("/dev/shm") if f.startswith("mpich_shm_")}


def test_a_rank_that_dies_ends_the_job():
    before, mpich_before = set(segment.list_entries()), mpich_files()
    res = mpiexec("0,0,1,1", "die", timeout=120)     # a hang fails here
    assert res.returncode != 0
    assert set(segment.list_entries()) <= before
    for name in mpich_files() - mpich_before:       # MPICH's own, left by the killed job
        os.unlink(os.path.join("/dev/shm", name))


def test_perf_mpi_prints_the_table_for_every_composition():
    """`shmcoll perf --mpi` under mpiexec, two "nodes" of two ranks (Hydra's per-block
    environment), every composition and auto: a row per size, no wrong element."""
    block = [sys.executable, "-m", "shmcoll", "perf", "allreduce", "--mpi", "--algo", "all",
             "-b", "8", "-e", "64K", "-f", "64", "-n", "5", "-w", "1"]
    res = subprocess.run([MPIEXEC, "-n", "2", "-env", "SHMCOLL_NODE", "a", *block, ":",
                          "-n", "2", "-env", "SHMCOLL_NODE", "b", *block],
                         capture_output=True, text=True, timeout=300, env=procs.python_env(),
                         cwd=procs.HERE)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "# shmcoll.mpi: 4 ranks on 2 node(s)" in out
    for algo in ("hierarchical", "leader", "flat"):
        assert f"algo {algo}" in out
    rows = [line.split() for line in out.splitlines()
            if line.strip() and line.strip()[0].isdigit() and len(line.split()) >= 13]
    assert len(rows) == 3 * 3                        # 8 B, 512 B, 32 KiB per composition
    assert all(row[8] == "0" and row[12] == "0" for row in rows)   # #wrong
    assert "auto picks" in out


def test_the_mpi_comparison_benchmark_times_every_collective_correctly():
    """bench/mpi_collectives.py, which `shmcoll perf` is compared with, runs under a
    real mpiexec and checks the results it times."""
    script = os.path.join(os.path.dirname(procs.HERE), "bench", "mpi_collectives.py")
    res = subprocess.run([MPIEXEC, "-n", "2", sys.executable, script, "--sizes", "8,4K"],
                         capture_output=True, text=True, timeout=300, env=procs.python_env())
    assert res.returncode == 0, res.stderr[-3000:]
    rows = lines_of(res)
    assert sorted((r["collective"], r["bytes"]) for r in rows) == sorted(
        (c, n) for c in ("broadcast", "allgather", "reduce_scatter", "allreduce")
        for n in (8, 4096))
    assert all(r["ok"] and r["P"] == 2 and r["time_us"] > 0 for r in rows), rows
