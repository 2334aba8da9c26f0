"""Live ranks for the benchmarks: rank 0 is this pytest process, ranks 1..P-1 are
mirror processes that repeat each benchmarked call, started once per session."""
import os
import secrets

import pytest

import shmcoll
from shmcoll.collectives import bus_factor
from shmcoll.tools.harness import (build, copy_reference_seconds, exchange_command,
                                   median_call_seconds, pin, start_mirrors)


class Ranks:
    def __init__(self, world):
        job = "bench-" + secrets.token_hex(8)
        here = os.path.dirname(os.path.dirname(shmcoll.__file__))   # this shmcoll, for the mirrors
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
        self.mirrors = start_mirrors(world, job, env=env, cwd=os.path.dirname(__file__))
        self.comm = shmcoll.init(rank=0, world_size=world, job=job)
        pin(0)      # rank r on the r-th CPU, as the mirrors do: placement stays put

    def prepare(self, calls, **command):
        """Tell the mirrors what to repeat `calls` times; return rank 0's case and call."""
        exchange_command(self.comm, dict(command, calls=calls))
        return build(self.comm, command)

    def yardstick(self, nbytes, calls):
        """Median seconds of a direct broadcast of nbytes from rank 0, timed call by call
        right now: the same cross-core wake-ups and transfers a collective pays, on a
        schedule no setting changes, so a slow stretch of the machine slows it too."""
        _, call = self.prepare(calls + 1, collective="broadcast", nbytes=nbytes,
                               dtype="uint8", op="sum", algo="direct", inplace=False)
        call()
        return median_call_seconds(call, calls)

    def close(self):
        exchange_command(self.comm, {"collective": "stop"})
        self.comm.close()
        for m in self.mirrors:
            m.wait(60)


_ranks = {}


@pytest.fixture(scope="session")
def ranks():
    def get(world):
        if world not in _ranks:
            _ranks[world] = Ranks(world)
        return _ranks[world]
    yield get
    for r in _ranks.values():
        r.close()
    _ranks.clear()


def rounds_for(nbytes):
    """About 0.1 s of traffic per benchmark, at least 20 rounds, at most 2000."""
    return max(20, min(2000, int(2e8 // max(nbytes, 1))))


@pytest.fixture
def run_collective(ranks, benchmark):
    """Benchmark one collective end to end; record size, P, algorithm and bandwidths."""
    def run(world, collective, nbytes, dtype="float32", op="sum", algo=None, inplace=False,
            symmetric=False):
        rounds, warmup = rounds_for(nbytes), 2
        reference = None if benchmark.disabled else copy_reference_seconds(nbytes)
        # pytest-benchmark calls the target exactly warmup + rounds times, or once
        # when disabled (--benchmark-disable): the mirrors repeat it as often.
        calls = 1 if benchmark.disabled else rounds + warmup
        case, call = ranks(world).prepare(calls, collective=collective, nbytes=nbytes,
                                          dtype=dtype, op=op, algo=algo, inplace=inplace,
                                          symmetric=symmetric)
        benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=warmup)
        where_out = ("in place" if inplace and collective == "allreduce" else "symmetric") \
            if symmetric else None
        benchmark.extra_info.update(
            bytes=case.nbytes, world=world, dtype=dtype, op=op, inplace=inplace,
            symmetric=symmetric,
            algorithm="p2p" if collective == "sendrecv" else
            ranks(world).comm.algorithm_for(collective, case.nbytes, algo, symmetric=where_out))
        if benchmark.stats is not None:
            seconds = benchmark.stats.stats.median
            yard = ranks(world).yardstick(case.nbytes, max(5, rounds // 2))
            algbw = case.nbytes / seconds / 1e9 if seconds else 0.0
            benchmark.extra_info.update(algbw_GBs=algbw,
                                        busbw_GBs=algbw * bus_factor(collective, world),
                                        reference_s=reference, ratio=seconds / reference,
                                        yardstick_s=yard, yardstick_ratio=seconds / yard)
    return run
