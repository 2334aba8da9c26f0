"""Any array in: torch tensors (bfloat16, float16, bool, complex included), DLPack
producers, the buffer protocol and __array_interface__ reach the CPU engine without a
copy and come back in the caller's kind; device arrays are told apart by what they
are, not by what their class declares."""
import numpy as np
import pytest

import array_workers as aw
import shmcoll
from reference import BFLOAT16, assert_cases_match, case_grid
from shmcoll import arrays
from shmcoll.collectives import ROOTED
from shmcoll.cuda.host import HostArray

torch = pytest.importorskip("torch")

DTYPES_OPS = [("float32", "sum"), ("float16", "avg"), ("int64", "bxor"), ("bool", "max"),
              ("bool", "band"), ("complex64", "sum"), ("complex128", "avg")] + \
    ([("bfloat16", "sum")] if BFLOAT16 is not None else [])


def torch_cases(P):
    return case_grid(P, DTYPES_OPS, [(0,), (5, 3), (70001,)], 5,
                     roots_of=lambda coll: (0, P - 1) if coll in ROOTED else (0,))


def check(cases, got, P):
    """Every value right, every result a tensor, and the caller's own out (or x of
    broadcast) where one was passed."""
    assert_cases_match(cases, [[value for value, _, _ in per_rank] for per_rank in got], P)
    kinds = [(cases[i], rank) for rank in range(P) for i, (_, tensor, own) in enumerate(got[rank])
             if not (tensor and own)]
    assert not kinds, f"{len(kinds)} results of the wrong kind or memory: {kinds[:5]}"


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_collective_on_torch_tensors_against_numpy(pools, P):
    cases = torch_cases(P)
    check(cases, pools(P).run(aw.run_torch_cases, cases), P)


@pytest.mark.parametrize("P", [2, 3])
def test_torch_out_is_written_and_returned(pools, P):
    cases = [c for c in torch_cases(P) if not c[4]]
    check(cases, pools(P).run(aw.run_torch_cases, cases, True), P)


def test_torch_tensors_with_async_op(pools):
    cases = torch_cases(2)[::3]
    check(cases, pools(2).run(aw.run_torch_cases, cases, False, True), 2)


def test_dlpack_buffers_and_array_interface(pools):
    P = 3
    for r, (dl, ai, aa, mv, ba, bc, inplace_dl) in enumerate(pools(P).run(aw.other_kinds)):
        assert dl == ai == [6.0] * 4
        assert aa == [3, 6]
        assert mv == (True, [6.0] * 4)
        assert ba == (True, [0, 1, 2])
        assert bc == (True, [0, 1, 2])
        assert inplace_dl == [6.0] * 4


def test_bad_non_numpy_arguments_are_refused_before_anything_runs(pools):
    for got in pools(2).run(aw.refusals):
        assert got.pop("after") == [2.0, 2.0]
        kinds = {name: kind for name, (kind, _) in got.items()}
        assert kinds == {"read-only out": "ValueError", "bool sum": "ValueError",
                         "complex prod": "ValueError", "complex max": "ValueError",
                         "conj out": "ValueError", "non-contiguous out": "ValueError",
                         "wrong out dtype": "TypeError"}, got
        assert "max (any) or min (all)" in got["bool sum"][1]
        assert "sum and avg only" in got["complex prod"][1]
        assert "read-only" in got["read-only out"][1]


def test_tensors_that_require_grad_or_are_strided(pools):
    for y, g, t in pools(2).run(aw.grad_and_strided):
        assert y == g == [2.0] * 3
        assert t == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]


# -- the dispatch decision, without a GPU ------------------------------------------------
class _FakeCudaTensor:
    """What a CUDA tensor says of itself: a DLPack device of type CUDA."""

    def __dlpack_device__(self):
        return (2, 0)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


class _DeclaresButHasNone:
    """A class declaring the CUDA interface that its instances cannot give (a CPU
    torch tensor's case, without DLPack)."""

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("not a CUDA array")


def test_device_arrays_are_told_by_what_they_are():
    assert not arrays.is_device_array(torch.ones(2))       # declares the interface, raises
    assert hasattr(type(torch.ones(2)), "__cuda_array_interface__")
    assert arrays.is_device_array(_FakeCudaTensor())
    assert not arrays.is_device_array(_DeclaresButHasNone())
    assert arrays.is_device_array(HostArray(np.ones(2)))   # the host stand-in's device arrays
    for host in (np.ones(2), memoryview(b"ab"), bytearray(2), [1, 2], None,
                 aw.DLPackOnly(np.ones(2))):
        assert not arrays.is_device_array(host)


def test_host_views_share_memory():
    t = torch.arange(4, dtype=torch.float32)
    assert np.shares_memory(arrays.as_numpy(t), t.numpy())
    if BFLOAT16 is not None:
        b = torch.ones(3, dtype=torch.bfloat16)
        view = arrays.as_numpy(b)
        assert view.dtype == BFLOAT16 and view.ctypes.data == b.data_ptr()
    base = np.ones(3)
    assert np.shares_memory(arrays.as_numpy(aw.DLPackOnly(base)), base)
    assert np.shares_memory(arrays.as_numpy(aw.ArrayInterfaceOnly(base)), base)
    raw = bytearray(8)
    arrays.as_out(raw)[:] = 7
    assert raw == bytearray([7] * 8)
    with pytest.raises(ValueError, match="read-only"):
        arrays.as_out(memoryview(b"xy"))


def test_a_cpu_tensor_reaches_the_cpu_engine_in_one_process():
    """The first call a torch user makes (it used to raise DeviceError)."""
    def work(comm):
        return comm.allreduce(torch.ones(4)).tolist()
    with shmcoll.init(rank=0, world_size=1, job="torch-first-call") as comm:
        assert work(comm) == [1.0] * 4


def test_import_shmcoll_never_imports_torch_or_ml_dtypes():
    """Optional packages stay unimported: ml_dtypes' import alone takes most of a
    second, which every rank of every launch would pay."""
    from procs import run
    done = run("-c", "import sys, numpy, shmcoll, shmcoll.communicator, shmcoll.arrays; "
                     "print('torch' in sys.modules, 'ml_dtypes' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False False", done.stderr


def test_bfloat16_is_known_once_ml_dtypes_is_imported_after_shmcoll():
    """bfloat16 is registered at the first array of that type, not at import."""
    from procs import run
    done = run("-c", "import numpy as np, shmcoll\n"
                     "import ml_dtypes\n"
                     "x = np.array([1.5, 2.25], ml_dtypes.bfloat16)\n"
                     "with shmcoll.init(rank=0, world_size=1, job='bf16-late') as comm:\n"
                     "    print(comm.allreduce(x).astype(np.float32).tolist(),\n"
                     "          comm.allgather(x).dtype)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1.5, 2.25] bfloat16"
