"""shmcoll.mpi: the hierarchical communicator under a real mpiexec (MPICH's Hydra
from the test extra), one machine playing several nodes through SHMCOLL_NODE: every
collective x dtype x op against numpy with one node, two equal nodes, uneven nodes,
nodes of one rank (pure MPI) and nodes whose ranks interleave; a rank that dies ends
the job instead of hanging it."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import procs

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
if MPIEXEC is None:
    pytest.skip("no mpiexec", allow_module_level=True)


def mpiexec(layout, *extra, timeout=240):
    n = len(layout.split(","))
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "mpi_rank.py", layout, *extra],
                          capture_output=True, text=True, timeout=timeout,
                          env=procs.python_env(), cwd=procs.HERE)


@pytest.mark.parametrize("layout,nodes", [("0,0", 1), ("0,0,1,1", 2), ("0,0,0,1", 2),
                                          ("0,1,2", 3), ("1,0,1,0", 2)])
def test_every_collective_against_numpy(layout, nodes):
    res = mpiexec(layout)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(s) for s in res.stdout.splitlines() if s.startswith("{")]
    assert sorted(line["rank"] for line in lines) == list(range(len(layout.split(","))))
    for line in lines:
        assert line["nodes"] == nodes and line["problems"] == [], line


def test_a_rank_that_dies_ends_the_job():
    res = mpiexec("0,0,1,1", "die", timeout=120)     # a hang fails here
    assert res.returncode != 0
