"""The torch.distributed backend "shmcoll" (shmcoll.torch): every call torch makes on a
CPU process group against the numpy reference, at P = 1..4, blocking and async; DDP
against single-process training; torchrun; what is refused and how."""
import datetime
import re
import socket

import numpy as np
import pytest

import procs
import torch_workers as tw
from reference import BFLOAT16, assert_cases_match, case_grid
from shmcoll.collectives import ROOTED

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import shmcoll.torch as shmcoll_torch  # noqa: E402
from shmcoll.torch import devices, rendezvous  # noqa: E402

DTYPES_OPS = [("float32", "sum"), ("float32", "prod"), ("float32", "min"), ("float32", "avg"),
              ("float64", "max"), ("float16", "sum"), ("float16", "avg"), ("int32", "band"),
              ("int64", "bxor"), ("int64", "sum"), ("uint8", "bor"), ("int8", "min"),
              ("bool", "max"), ("bool", "band"), ("complex64", "sum")] + \
    ([("bfloat16", "sum"), ("bfloat16", "avg")] if BFLOAT16 is not None else [])

_STORE_DIR = []      # (set once per test run by _store_dir)


@pytest.fixture(scope="session", autouse=True)
def _store_dir(tmp_path_factory):
    """Where the pools' FileStores lie: pytest's temporary directory, which it removes
    itself (a pool's ranks keep their default group, and so its store, for the session)."""
    _STORE_DIR[:] = [tmp_path_factory.mktemp("torch-stores")]


def store(P):
    """The FileStore path the ranks of the P-rank pool share for their default group."""
    return str(_STORE_DIR[0] / f"store-{P}")


def cases(P):
    return case_grid(P, DTYPES_OPS, [(0,), (5, 3), (4099,)], 11,
                     roots_of=lambda coll: (0, P - 1) if coll in ROOTED else (0,),
                     skip=("alltoall", "sendrecv"))     # test_all_to_all_and_point_to_point


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_call_against_the_reference(pools, P):
    """all_reduce, reduce, broadcast, all_gather(_into_tensor), reduce_scatter(_tensor),
    gather, scatter: every dtype (bfloat16, float16, bool, complex included) and op."""
    grid = cases(P)
    assert_cases_match(grid, pools(P).run(tw.run_cases, store(P), grid, False), P)


@pytest.mark.parametrize("P", [2, 3])
def test_async_calls_against_the_reference(pools, P):
    """The same calls with async_op=True, completed by wait() or through the future."""
    grid = cases(P)[::2]
    assert_cases_match(grid, pools(P).run(tw.run_cases, store(P), grid, True), P)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_all_to_all_and_point_to_point(pools, P):
    for r, seen in enumerate(pools(P).run(tw.all_to_all_and_p2p, store(P))):
        assert seen["even"] == [float(100 * q + 3 * r + i) for q in range(P) for i in range(3)]
        split = []
        for q in range(P):
            start = sum((q + j) % 3 for j in range(r))      # rows rank q sends before r's
            split += [[1000 * q + 2 * (start + i), 1000 * q + 2 * (start + i) + 1]
                      for i in range((q + r) % 3)]
        assert seen["split"] == split
        assert seen["lists"] == [[[float(q * 10 + r)] * (q + 1)] * (r + 1) for q in range(P)]
        if P > 1:
            assert seen["sendrecv"] == [float((r - 1) % P)] * 3
            assert seen["batch"] == (float((r - 1) % P),) * 2
            assert seen["across"] == [P * (P + 1) / 2] * 4 + [float((r - 1) % P)] * 4
        if P > 1 and r < 2:     # rank 0 got rank 1's answer: the second message + 1
            assert seen["irecv_first"] == ([3.0] if r == 0 else [2.0]) * 3


@pytest.mark.parametrize("P", [2, 3])
def test_torch_specifics(pools, P):
    for r, seen in enumerate(pools(P).run(tw.torch_specifics, store(P))):
        assert seen["backend"] == "shmcoll"
        assert seen["bool"] == ([True, True, False], [False, True, False])
        assert seen["premul"] == [0.5 * sum(range(1, P + 1))] * 5
        nc, bc, gt = seen["noncontig"]
        total = sum(range(1, P + 1))
        assert nc == (torch.arange(12.0).view(3, 4) * total).t().tolist()
        assert bc == [[float(P - 1)] * 4] * 3
        assert gt == torch.cat([torch.full((2, 3), float(q)) for q in range(P)]).tolist()
        a1, a2, a3, ag, rs = seen["coalesced"]
        ranks = sum(range(P))
        assert a1 == [float(ranks)] * 3 and a2 == [float(ranks)] * 2 and a3 == [2.0 * P] * 4
        assert ag == [[float(q) for q in range(P) for _ in range(2)],
                      [float(q) for q in range(P) for _ in range(3)]]
        assert rs == [[float(r * P)], [float(2 * r * P), float((2 * r + 1) * P)]]
        objs, lst = seen["objects"]
        assert objs == [{"rank": q, "text": "x" * q} for q in range(P)]
        assert lst == [{"from": 0}, 0]
        fut, results = seen["future"]
        assert fut == [10.0 * P] * 3
        assert results == [[float(i * P)] * 2 for i in range(4)]
        assert seen["zero"] == 0
        for name, text in seen["refused"].items():
            assert text is not None and name.split("_")[0] in text and "shmcoll" in text
        assert seen["bad_op"] and "avg" in seen["bad_op"].lower()


def test_subgroups_and_their_destruction(pools):
    got = pools(3).run(tw.subgroup, store(3))
    assert [g for g, _ in got] == [[2.0] * 3, None, [2.0] * 3]
    assert all(t == [3.0, 3.0] for _, t in got)


def test_ranks_that_disagree_fail_the_call_not_the_default_group(pools):
    for waited, failed, later, after in pools(2).run(tw.broken_group, store(2)):
        assert waited == "MismatchError" and failed
        assert later.startswith("RuntimeError") and "Mismatch" in later
        assert after == [2.0, 2.0]


@pytest.mark.parametrize("P,micro,static_graph,bucket_cap_mb", [
    (2, 1, False, 25), (3, 2, False, 0.001), (2, 1, True, 0.001)])
def test_ddp_trains_like_one_process_on_the_full_batch(pools, P, micro, static_graph,
                                                       bucket_cap_mb):
    """Bucketed gradient allreduce (tiny buckets: one per parameter), no_sync()
    accumulation, static_graph: the ranks' parameters are bitwise equal, and equal to
    single-process training on the whole batch up to float64 rounding."""
    steps = 4
    per_rank = pools(P).run(tw.ddp_train, store(P), steps, micro, static_graph, bucket_cap_mb)
    for params in per_rank[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(params, per_rank[0]))
    expected = tw.single_process_train(steps, micro, P)
    for got, want in zip(per_rank[0], expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_a_rank_dying_during_ddp_is_an_error_on_the_others(tmp_path):
    """DDP waits for its gradient buckets' futures from C++: a failed allreduce must
    complete them with an error (not a value DDP would read as gradients)."""
    store_path = str(tmp_path / "store")
    ranks = [procs.spawn("ddp_peer_death.py", store_path, str(r)) for r in range(2)]
    with procs.cleaned_up(ranks):
        out, err = ranks[0].communicate(timeout=120)
        ranks[1].wait(timeout=60)
    assert ranks[1].returncode == 7
    assert ranks[0].returncode == 0, err[-3000:]
    assert "error at step 3" in out and "PeerLostError" in out and "rank 1" in out


def test_torchrun_starts_the_backend_and_ddp_trains(tmp_path):
    # (TMPDIR: torchrun leaves its log directories behind)
    res = procs.run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "torchrun_rank.py", timeout=180, TMPDIR=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    # (the ranks share one stdout: their lines may run together)
    lines = sorted(re.findall(r"rank \d of \d: .* equal \w+", res.stdout))
    assert lines == [f"rank {r} of 2: shmcoll sum [3.0, 3.0, 3.0, 3.0] replicas equal True"
                     for r in range(2)]


# -- in this process -----------------------------------------------------------------
def test_the_backend_is_registered_for_cpu():
    assert "shmcoll" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("cpu") != "shmcoll"
    shmcoll_torch.register()        # twice is fine
    assert dist.Backend("shmcoll") == "shmcoll"


def test_a_group_of_one_process(tmp_path):
    store_path = str(tmp_path / "store")
    pg = shmcoll_torch.ProcessGroupShmcoll(dist.FileStore(store_path, 1), 0, 1,
                                           datetime.timedelta(seconds=30))
    try:
        t = torch.arange(4.0)
        assert pg.allreduce([t]).wait() and t.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert pg.name() == "shmcoll" and pg.size() == 1 and pg.rank() == 0
    finally:
        pg.shutdown()


def test_a_group_spanning_hosts_is_refused(monkeypatch):
    store = dist.HashStore()
    store.set("shmcoll/host/1", "another-machine")
    monkeypatch.setattr(rendezvous.socket, "gethostname", lambda: "this-machine")
    with pytest.raises(RuntimeError, match="one machine.*another-machine"):
        rendezvous.join(store, 0, 2, datetime.timedelta(seconds=5))


def test_timeouts_in_seconds():
    assert rendezvous.seconds(datetime.timedelta(minutes=2)) == 120.0
    assert rendezvous.seconds(datetime.timedelta(0)) == float("inf")
    assert rendezvous.seconds(None) is None


class _FakeDevice:
    def __init__(self, type_):
        self.type = type_

    def __str__(self):
        return f"{self.type}:0"


class _FakeGroup:
    _store = dist.HashStore()
    _timeout = datetime.timedelta(seconds=9)

    def rank(self):
        return 1

    def size(self):
        return 2


def test_cuda_tensors_go_to_the_backend_named_for_cuda(monkeypatch):
    made = []
    monkeypatch.setattr(dist, "get_backend_config", lambda group: "cpu:shmcoll,cuda:nccl")
    backend = devices.backend_for(_FakeGroup(), _FakeDevice("cuda"), "all_reduce",
                                  construct=lambda *a: made.append(a) or "the nccl backend")
    assert backend == "the nccl backend"
    name, store, rank, size, timeout = made[0]
    assert (name, rank, size, timeout) == ("nccl", 1, 2, datetime.timedelta(seconds=9))


def test_cuda_tensors_without_a_cuda_backend_are_refused(monkeypatch):
    monkeypatch.setattr(dist, "get_backend_config", lambda group: "shmcoll")
    with pytest.raises(RuntimeError, match="all_reduce got a tensor on cuda:0.*cuda:nccl"):
        devices.backend_for(_FakeGroup(), _FakeDevice("cuda"), "all_reduce")


def test_init_strings():
    assert devices.named_backends("cpu:shmcoll,cuda:nccl") == {"cpu": "shmcoll",
                                                               "cuda": "nccl"}
    assert devices.named_backends("shmcoll") == {}
    assert devices.named_backends(" cpu : shmcoll , cuda:NCCL") == {"cpu": "shmcoll",
                                                                   "cuda": "nccl"}


def test_tcp_rendezvous():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = procs.run("-c", (
        "import torch, torch.distributed as dist, shmcoll.torch\n"
        f"dist.init_process_group('shmcoll', init_method='tcp://127.0.0.1:{port}', "
        "rank=0, world_size=1)\n"
        "t = torch.ones(2); dist.all_reduce(t); print(dist.get_backend(), t.tolist())\n"
        "dist.destroy_process_group()\n"), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["shmcoll", "[1.0,", "1.0]"]


def test_mixed_init_string_creates_the_group(tmp_path):
    """init_process_group("cpu:shmcoll,cuda:nccl") on a machine without CUDA: the CPU
    side is shmcoll's; CUDA's backend would be made at the first CUDA tensor."""
    res = procs.run("-c", (
        "import torch, torch.distributed as dist, shmcoll.torch\n"
        f"dist.init_process_group('cpu:shmcoll,cuda:nccl', store=dist.FileStore("
        f"{str(tmp_path / 'store')!r}, 1), rank=0, world_size=1)\n"
        "t = torch.ones(3); dist.all_reduce(t)\n"
        "print(type(dist.group.WORLD).__name__, dist.get_backend_config(), t.tolist())\n"
        "dist.destroy_process_group()\n"), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["ProcessGroupShmcoll", "cpu:shmcoll,cuda:nccl",
                                  "[1.0,", "1.0,", "1.0]"]


@pytest.mark.parametrize("P", [2, 3])
def test_symmetric_tensors(pools, P):
    n = 70000
    for r, seen in enumerate(pools(P).run(tw.symmetric_tensors, store(P))):
        assert seen["zero"]
        np.testing.assert_array_equal(seen["allreduce"],
                                      np.arange(n, dtype=np.float32) * sum(range(1, P + 1)))
        full = sum(np.arange(P * 12, dtype=np.float64).reshape(P * 4, 3) + q for q in range(P))
        np.testing.assert_array_equal(seen["reduce_scatter"], full[r * 4:(r + 1) * 4])
        np.testing.assert_array_equal(seen["bf16"], [sum(range(1, P + 1))] * 5)
        assert seen["runs"].startswith("symmetric"), seen["runs"]
        assert "not shmcoll" in seen["foreign"], seen["foreign"]
