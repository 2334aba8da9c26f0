"""The GPU path on a real GPU (CuPy arrays, CUDA IPC), every rank on the one GPU it
finds: skipped cleanly without CuPy or a device."""
import pytest

cupy = pytest.importorskip("cupy")
try:
    DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver is the same as no device here
    DEVICES = 0

import shmcoll  # noqa: E402
import workers  # noqa: E402
from test_cuda_path import assert_matches_numpy, device_cases  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICES == 0, reason="no CUDA device")]


@pytest.fixture(autouse=True)
def cupy_backend(monkeypatch):
    monkeypatch.setenv("SHMCOLL_CUDA_BACKEND", "cupy")
    monkeypatch.setenv("SHMCOLL_CUDA_BUFFER_BYTES", "65536")   # several pieces per case


@pytest.mark.parametrize("P", [2, 4, 8])
def test_every_device_schedule_against_numpy_on_the_gpu(P):
    cases = device_cases(P)
    got = shmcoll.launch(workers.run_device_cases, P, args=(cases,), timeout=900)
    assert_matches_numpy(cases, got)


def test_large_allreduce_and_same_bits_everywhere():
    got = shmcoll.launch(workers.cupy_large_allreduce, 2, args=(64 << 20,), timeout=600)
    for wrong, digest in got:
        assert wrong == 0
    assert len({d for _, d in got}) == 1


def test_collectives_follow_the_current_stream():
    got = shmcoll.launch(workers.cupy_stream_order, 2, timeout=300)
    assert got == [True, True]


def test_async_op_on_the_gpu_waits_for_its_stream():
    import nonblocking_workers
    assert shmcoll.launch(nonblocking_workers.cupy_async_allreduce, 2, timeout=300) == \
        [True, True]
