"""The GPU path without a GPU: dispatch, argument checks, the IPC handle exchange and
every device schedule, run on the host stand-in backend (SHMCOLL_CUDA_BACKEND=host:
"device" buffers in shared memory, arrays exposing __cuda_array_interface__ over
host memory) against the same numpy reference as the CPU engine."""
import os

import numpy as np
import pytest

import shmcoll
import workers
from reference import bitwise_equal, dtype_of, expected_result
from shmcoll.cuda import is_device_array, kernels
from shmcoll.cuda.collectives import block_range, pieces
from shmcoll.cuda.host import HostArray
from shmcoll.cuda.path import VARIANTS

# A small staging buffer, so messages of a few KiB already go through several pieces.
ENV = {"SHMCOLL_CUDA_BACKEND": "host", "SHMCOLL_CUDA_BUFFER_BYTES": "4096"}


@pytest.fixture(autouse=True)
def host_backend(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


def device_cases(P):
    cases = []
    for coll, algs in VARIANTS.items():
        for algo in list(algs) + [None]:
            for root in ((0, P - 1) if coll in ("broadcast", "reduce", "gather", "scatter") else (0,)):
                for dt, op in (("float32", "sum"), ("float16", "sum"), ("bfloat16", "avg"),
                               ("int32", "max"), ("int64", "bxor"), ("uint8", "prod"),
                               ("float64", "min"), ("int16", "avg")):
                    if coll not in ("allreduce", "reduce", "reduce_scatter") and op != "sum":
                        continue
                    for rows in (1, 3, 1500):       # 1500 float64 rows: 3 pieces of 4 KiB
                        shape = (P * rows,) if coll == "reduce_scatter" else (rows, 2)
                        inplace = coll == "allreduce" and rows == 3
                        cases.append((coll, shape, dt, op, inplace, algo, 7, root))
    return cases


@pytest.mark.parametrize("sync", ["device", "host"])
@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_every_device_schedule_against_numpy(P, sync, monkeypatch):
    monkeypatch.setenv("SHMCOLL_CUDA_SYNC", sync)
    cases = device_cases(P)
    got = shmcoll.launch(workers.run_device_cases, P, args=(cases,), timeout=600)
    assert_matches_numpy(cases, got)


def assert_matches_numpy(cases, got):
    """Every rank's result of every case, bit for bit, against the numpy reference."""
    P, bad = len(got), []
    for rank in range(P):
        for case, result in zip(cases, got[rank]):
            want = expected_result(case, P, rank)
            if want is not None:
                want = np.asarray(want).astype(dtype_of(case[2]))
            if not bitwise_equal(result, want):
                bad.append((rank, case))
    assert not bad, f"{len(bad)} wrong, e.g. {bad[:3]}"


@pytest.mark.parametrize("sync", ["device", "host"])
def test_random_sequences_mixing_one_phase_and_multi_phase_schedules(sync, monkeypatch):
    """Consecutive calls reuse the buffers' halves: a schedule must never overwrite
    what a slower peer is still reading."""
    monkeypatch.setenv("SHMCOLL_CUDA_SYNC", sync)
    rng = np.random.default_rng(5)
    P, cases = 4, []
    for i in range(60):
        coll = str(rng.choice(["allreduce", "allgather", "broadcast", "reduce_scatter", "gather"]))
        algo = str(rng.choice(list(VARIANTS[coll]) + ["auto"]))
        rows = int(rng.choice([1, 7, 700, 2100]))
        shape = (P * rows,) if coll == "reduce_scatter" else (rows,)
        cases.append((coll, shape, "float32", "sum", False, None if algo == "auto" else algo,
                      i, int(rng.integers(P))))
    for slow in (None, 0, P - 1):
        got = shmcoll.launch(workers.run_device_cases_one_slow, P,
                             args=(cases, slow, 0.002 if slow is not None else 0.0), timeout=600)
        assert_matches_numpy(cases, got)


def test_every_rank_gets_the_same_bits_and_two_shot_equals_one_shot():
    # random floats: association order matters, so equal bits mean equal order
    got = shmcoll.launch(workers.float_sum_random_device, 3, args=(5000, "float32", 11), timeout=120)
    for rank in range(3):
        assert got[rank][0].tobytes() == got[0][0].tobytes()      # one-shot on every rank
        assert got[rank][1].tobytes() == got[0][0].tobytes()      # two-shot = one-shot
        assert got[rank][2].tobytes() == got[0][2].tobytes()      # ring on every rank


def test_dispatch_by_array_type():
    assert is_device_array(HostArray(np.zeros(3)))
    assert not is_device_array(np.zeros(3))
    assert not is_device_array(None)
    assert not is_device_array([1, 2])


def test_pieces_and_blocks():
    assert pieces(10000, 4096, 8) == [(0, 4096), (4096, 4096), (8192, 1808)]
    assert pieces(0, 4096, 4) == [(0, 0)]
    assert pieces(12, 5, 4) == [(0, 4), (4, 4), (8, 4)]
    assert [block_range(10, 3, b) for b in range(3)] == [(0, 4), (4, 3), (7, 3)]


def test_arguments_are_checked_before_any_device_work():
    f32 = np.zeros(8, np.float32)
    cases = {
        "allreduce": ({"x": f32, "op": "band"}, "ValueError", "not defined"),
        "reduce_scatter": ({"x": np.zeros(7, np.float32)}, "ValueError", "divisible"),
        "broadcast": ({"x": f32, "root": 5}, "ValueError", "root"),
    }
    for method, (kwargs, kind, text) in cases.items():
        got = shmcoll.launch(workers.device_call_error, 2, args=(method, [kwargs, kwargs]),
                             timeout=60)
        for res in got:
            assert res is not None and res[0] == kind and text in res[1], (method, res)
    bad_out = {"x": f32, "out": np.zeros(4, np.float32)}
    got = shmcoll.launch(workers.device_call_error, 2, args=("allreduce", [bad_out, bad_out]),
                         timeout=60)
    assert all(r[0] == "ValueError" and "shape" in r[1] for r in got)
    bools = {"x": np.zeros(4, bool)}
    got = shmcoll.launch(workers.device_call_error, 2, args=("allreduce", [bools, bools]),
                         timeout=60)
    assert all(r[0] == "TypeError" for r in got)


def test_ranks_calling_differently_get_mismatch_error_on_every_rank():
    a = {"x": np.zeros(8, np.float32)}
    b = {"x": np.zeros(9, np.float32)}
    got = shmcoll.launch(workers.device_call_error, 2, args=("allreduce", [a, b]), timeout=60)
    assert all(r is not None and r[0] == "MismatchError" and "count" in r[1] for r in got)
    c = {"x": np.zeros(8, np.float32), "op": "max"}
    got = shmcoll.launch(workers.device_call_error, 2, args=("allreduce", [a, c]), timeout=60)
    assert all(r is not None and r[0] == "MismatchError" and "op" in r[1] for r in got)


def test_buffers_are_closed_and_freed_and_leave_nothing_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    left = shmcoll.launch(workers.device_setup_then_close, 3, timeout=60)
    assert left == [0, 0, 0]
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("shmcoll-dev")]


def test_unknown_backend_and_missing_cupy_say_what_to_do(monkeypatch):
    monkeypatch.setenv("SHMCOLL_CUDA_BACKEND", "warp")
    got = shmcoll.launch(workers.device_backend_error, 2, timeout=60)
    assert all("SHMCOLL_CUDA_BACKEND" in g for g in got)
    try:
        import cupy  # noqa: F401
        return
    except ImportError:
        pass
    monkeypatch.setenv("SHMCOLL_CUDA_BACKEND", "cupy")
    got = shmcoll.launch(workers.device_backend_error, 2, timeout=60)
    assert all("shmcoll[cuda]" in g for g in got)


def test_import_and_cpu_path_never_import_cupy():
    assert shmcoll.launch(workers.cpu_allreduce_imports, 2, timeout=60) == [(6.0, False)] * 2


def test_device_algorithms_are_decided_by_their_own_model():
    queries = [("allreduce", 8, None), ("allreduce", 1 << 30, None), ("reduce", 8, "direct"),
               ("allreduce", 8, "tree"), ("broadcast", 1 << 30, None)]
    small, large, rooted, tree, bcast = shmcoll.launch(workers.device_algorithm_for, 4,
                                                       args=(queries,), timeout=60)[0]
    assert small == "direct (one-shot)"
    assert large in ("direct (two-shot)", "ring")
    assert rooted == "direct (star)"
    assert tree.startswith("ValueError") and "does not run" in tree
    assert bcast in ("direct (star)", "ring (chain)")


def test_kernel_names_cover_every_supported_pair():
    names = kernels.all_names()
    assert len(names) == len(set(names))
    assert kernels.reduce_name("float16", "sum") in names
    assert not kernels.supports("float32", "band")
    assert kernels.supports("int8", "bxor")


def test_a_device_wait_gives_up_at_its_deadline():
    from shmcoll.cuda.host import HostBackend
    be = HostBackend()
    flags = [be.malloc(2 * 2 * 8), be.malloc(2 * 2 * 8)]
    try:
        for f in flags:
            be.memset(f, 0, 32)
        be.sync(flags, 1, 2, 0, -1, 1, 0, 0.1, None)       # rank 1 signals rank 0
        be.sync(flags, 0, 2, 0, -1, 0, 1, 0.1, None)       # so rank 0's wait returns
        with pytest.raises(shmcoll.TimeoutError, match="rank 1"):
            be.sync(flags, 0, 2, 0, -1, 0, 2, 0.1, None)   # a second signal never comes
    finally:
        for f in flags:
            be.free(f)


def test_perf_device_cuda_runs_the_gpu_path_and_checks_results():
    from procs import run
    res = run("-m", "shmcoll", "perf", "allgather", "--device", "cuda", "-np", "3", "-b", "12",
              "-e", "64K", "-f", "64", "--algo", "all", timeout=300, **ENV)
    assert res.returncode == 0, res.stderr
    assert "device cuda" in res.stdout and "auto picks" in res.stdout
    res = run("-m", "shmcoll", "perf", "allreduce", "--device", "cuda", "-np", "2", "-e", "4K",
              "-f", "8", "-d", "float16", timeout=300, **ENV)
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stdout.splitlines() if l.strip() and not l.startswith("#")]
    assert lines and all(l.split()[8] == "0" and l.split()[12] == "0" for l in lines)  # #wrong
    try:
        import cupy  # noqa: F401
    except ImportError:
        res = run("-m", "shmcoll", "perf", "allreduce", "--device", "cuda", timeout=60,
                  SHMCOLL_CUDA_BACKEND="cupy")
        assert res.returncode == 2 and "CuPy" in res.stderr


def test_device_decisions_print_in_the_override_grammar_with_device_algorithms_only():
    from shmcoll.tuning import calibration
    from shmcoll.tuning import selector
    rules = selector.describe(4, calibration.DEVICE_DEFAULT, variants=VARIANTS)
    assert {r.algorithm for r in rules} <= {"direct", "ring"}
    assert {r.collective for r in rules} == set(VARIANTS)
    assert selector.parse_overrides(str(rules)) == rules


def test_device_arrays_of_other_libraries_are_read_through_the_interface():
    from shmcoll.cuda.path import DeviceArray

    class Tensor:      # a dtype numpy cannot read, as torch's, and strides in bytes
        dtype = "torch.float32"

        def __init__(self, a):
            self._a = a
            self.__cuda_array_interface__ = {"shape": a.shape, "typestr": "<f4", "version": 3,
                                             "strides": a.strides, "data": (a.ctypes.data, False)}
    a = np.zeros((3, 4), np.float32)
    d = DeviceArray(Tensor(a), "x")
    assert (d.shape, d.dtype, d.nbytes, d.ptr) == ((3, 4), np.float32, 48, a.ctypes.data)
    with pytest.raises(ValueError, match="C-contiguous"):
        DeviceArray(Tensor(np.zeros((4, 3), np.float32).T), "x")


class _Recorder:
    """A backend that records what a schedule enqueues, for ordering checks."""

    def __init__(self):
        self.ops = []

    def copy(self, dst, src, nbytes, stream):
        self.ops.append(("write", dst))

    def copy2d(self, dst, dpitch, src, spitch, width, height, stream):
        self.ops.append(("write", dst))

    def reduce(self, out, table, nsrc, offset, count, dtype, op, world, stream):
        self.ops.append(("read", offset))

    def combine(self, *args):
        self.ops.append(("combine",))

    def sync(self, flags, me, world, kind, peer, signal_value, wait_value, timeout, stream):
        self.ops.append(("barrier",) if kind == 0 else ("ready",))


def _recording_schedules(world=2, half=4096):
    from types import SimpleNamespace
    from shmcoll.cuda.collectives import Schedules
    engine = SimpleNamespace(rank=0, world_size=world)
    sched = Schedules(engine, _Recorder(), half, 1.0)
    base = 1 << 20
    sched.buffers = SimpleNamespace(
        in_ptr=lambda r: base * (r + 1), aux_ptr=lambda r: base * (r + 1) + half,
        data_table=None, flag_table=None)
    return sched


def test_one_phase_pieces_alternate_halves_and_a_multi_phase_schedule_settles_first():
    from shmcoll.cuda.path import DeviceArray
    sched = _recording_schedules()
    x = DeviceArray(HostArray(np.zeros(16, np.float32)), "x")
    out = DeviceArray(HostArray(np.zeros(16, np.float32)), "out")
    sched.one_shot(out, x, x.dtype, "sum", None)
    sched.one_shot(out, x, x.dtype, "sum", None)
    ops = sched.backend.ops
    # write half 0, barrier, read half 0; then half 1: one barrier per piece
    assert ops == [("write", 1 << 20), ("barrier",), ("read", 0),
                   ("write", (1 << 20) + 4096), ("barrier",), ("read", 4096)]
    ops.clear()
    sched.two_shot(out, x, x.dtype, "sum", None)
    assert ops[0] == ("barrier",)          # the readers of the last half are done first
    assert ops[-1] == ("barrier",)         # and it leaves nothing being read
    ops.clear()
    sched.two_shot(out, x, x.dtype, "sum", None)
    assert ops[0] == ("write", 1 << 20)    # nothing to settle after a multi-phase schedule


@pytest.mark.parametrize("P", [1, 2, 3])
def test_device_calls_with_async_op_return_works(P):
    import nonblocking_workers
    cases = [c for c in device_cases(P) if c[1][0] != 1500]
    got = shmcoll.launch(nonblocking_workers.run_device_cases_async, P, args=(cases,),
                         timeout=600)
    assert_matches_numpy(cases, got)


def test_default_staging_buffer_follows_the_gpus_memory():
    from shmcoll.cuda.path import default_buffer_bytes
    assert default_buffer_bytes(143_771 << 20) == 512 << 20        # an H200
    assert default_buffer_bytes(16 << 30) == 64 << 20
    assert default_buffer_bytes(0) == 32 << 20                      # the host stand-in
