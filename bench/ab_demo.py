"""Live demonstration of `shmcoll bench-ab` on this machine: forcing allreduce onto the
naive schedule (side B) is seen as slower on the automatically chosen allreduce, while
the benchmarks that name their algorithm run the same schedule on both sides and stay
near a ratio of 1.  Timings, so not a test: run it by hand and read the table.

    python bench/ab_demo.py [-np 3] [--pairs 7]
"""
import sys

from shmcoll.tools import bench_ab as abtest

if __name__ == "__main__":
    args = sys.argv[1:] or ["-np", "3"]
    sys.exit(abtest.main(args + ["--collectives", "allreduce", "--sizes", "4K", "64K",
                                 "--b-env", "SHMCOLL_ALGO=allreduce:naive"]))
