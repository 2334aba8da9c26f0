"""What hostile and careless use must never get: a wrong answer returned as right, a
crashed process, a hang.  Two threads on one communicator, close() under a running
call, garbage in the segment, infinite timeouts, out-of-range roots, allocation
failures — each refused, raised or waited out with a ShmcollError that says what
happened and who."""
import mmap
import os
import secrets
import threading
import time

import numpy as np
import pytest

import shmcoll
from shmcoll import _engine
from shmcoll._core import segment
from shmcoll._core.settings import EngineParams
from procs import launch_timing_out_fast
from workers import (allreduce_with_memory_limit, close_during_call, close_from_signal_handler,
                     kill_self_on, late_allreduce, second_thread_enters, two_threads_hammer)


# -- two threads -------------------------------------------------------------------
def test_second_thread_is_refused_while_the_first_is_inside(tmp_path):
    (first, second), (peer, _) = shmcoll.launch(second_thread_enters, 2,
                                                args=(str(tmp_path / "go"),), timeout=120)
    assert first == ("ok", [2.0] * 4) and peer == [2.0] * 4
    assert second[0] == "ConcurrentCallError" and "another thread" in second[2], second


@pytest.mark.parametrize("world,count,calls", [(2, 1000, 300), (3, 1 << 17, 40)])
def test_two_threads_hammering_never_get_a_wrong_array(world, count, calls):
    """Single-slot and multi-chunk messages (the latter interleave chunk by chunk)."""
    for right, wrong, errors in shmcoll.launch(two_threads_hammer, world, args=(calls, count),
                                               timeout=60):
        assert (wrong, errors) == (0, []) and right == 2 * calls


def test_concurrent_call_error_is_a_runtime_error():
    assert issubclass(shmcoll.ConcurrentCallError, RuntimeError)
    assert issubclass(shmcoll.ConcurrentCallError, shmcoll.ShmcollError)


# -- close under a running call ----------------------------------------------------
@pytest.mark.parametrize("algo", ["direct", "ring", "tree"])
def test_close_from_another_thread_aborts_the_running_call(algo, tmp_path):
    (call, left, closed), (peer, _) = shmcoll.launch(
        close_during_call, 2, args=(algo, str(tmp_path / "go")), timeout=120)
    assert call[0] == "ClosedError" and "closed during the call" in call[1], call
    assert left and closed          # close() returned only once the call had left
    # rank 0's share was sent before it closed, or rank 1 learns that it left
    assert peer in ("ok", "PeerLostError"), peer


def test_close_from_a_signal_handler_of_the_waiting_thread(tmp_path):
    (kind, text, closed), peer = shmcoll.launch(close_from_signal_handler, 2,
                                                args=(str(tmp_path / "go"),), timeout=120)
    assert kind == "ClosedError" and "closed during the call" in text and closed, (kind, text)
    assert peer in ("ok", "PeerLostError")


def test_closed_communicator_refuses_calls_in_every_thread():
    with shmcoll.init(rank=0, world_size=1, job="solo-" + secrets.token_hex(4)) as comm:
        comm.close()
        errors = []
        t = threading.Thread(target=lambda: errors.append(
            pytest.raises(shmcoll.ClosedError, comm.allreduce, np.ones(2))))
        t.start()
        t.join()
        assert errors


# -- garbage in the segment --------------------------------------------------------
ALLREDUCE, FLOAT32, SUM, RING = 2, 10, 0, 0


def _forge_rank_1(name, layout, fields, seq):
    """Map the job's segment as an attacker would and play rank 1: attached, alive,
    with a call record of our choosing."""
    path = "/dev/shm" + name
    deadline = time.monotonic() + 10
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.05)    # let the creator format it
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, layout["ranks"] + 2 * layout["rank_block"])
    finally:
        os.close(fd)
    rank1 = layout["ranks"] + layout["rank_block"]
    m[rank1 + layout["pid"]:rank1 + layout["pid"] + 4] = os.getpid().to_bytes(4, "little")
    m[rank1 + layout["state"]:rank1 + layout["state"] + 4] = (1).to_bytes(4, "little")
    slot = rank1 + layout["calls"] + (1 % 4) * layout["call_slot"]
    body = b"".join(int(v).to_bytes(8, "little", signed=True) for v in fields)
    m[slot + layout["call_fields"]:slot + layout["call_fields"] + len(body)] = body
    m[slot:slot + 8] = seq.to_bytes(8, "little")
    m[layout["attached"]:layout["attached"] + 8] = (2).to_bytes(8, "little")
    # declines cross-memory attach (2): rank 0 goes on to the call
    m[rank1 + layout["cma_verdict"]:rank1 + layout["cma_verdict"] + 8] = (2).to_bytes(8, "little")
    return m


GARBAGE = [
    ("collective", [77, 4, FLOAT32, SUM, -1, RING], 1),
    ("count", [ALLREDUCE, -5, FLOAT32, SUM, -1, RING], 1),
    ("dtype", [ALLREDUCE, 4, 1 << 40, SUM, -1, RING], 1),
    ("op", [ALLREDUCE, 4, FLOAT32, 99, -1, RING], 1),
    ("root", [ALLREDUCE, 4, FLOAT32, SUM, 1 << 50, RING], 1),
    ("algorithm", [ALLREDUCE, 4, FLOAT32, SUM, -1, 12345], 1),
    ("sequence", [ALLREDUCE, 4, FLOAT32, SUM, -1, RING], 5),
]


@pytest.mark.parametrize("field,fields,seq", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_call_record_surfaces_as_a_shmcoll_error(field, fields, seq):
    job = "garbage-" + secrets.token_hex(4)
    name, _ = segment.job_identity(job)
    box = {}

    def rank0():
        try:
            with shmcoll.init(rank=0, world_size=2, job=job, timeout=5) as comm:
                comm.allreduce(np.ones(4, np.float32), algo="ring")
        except BaseException as e:  # noqa: BLE001 - the type is what is checked
            box["error"] = e
    t = threading.Thread(target=rank0)
    t.start()
    try:
        m = _forge_rank_1(name, _engine.layout(), fields, seq)
        t.join(30)
        m.close()
    finally:
        segment.unlink(name)
    e = box.get("error")
    assert isinstance(e, shmcoll.MismatchError), repr(e)
    assert e.field == field and e.ranks == (0, 1), str(e)


# -- timeouts ----------------------------------------------------------------------
def test_a_join_timeout_with_every_slot_taken_says_what_it_counted():
    """When no rank is missing yet the count never reaches the world size, the error
    says how many attachments the segment counted and which segment it was."""
    params = EngineParams.from_env(2, timeout=0.3)
    name, token = segment.launch_identity()
    seg = segment.create(name, 2, params, token)
    layout = _engine.layout()
    try:
        fd = os.open("/dev/shm" + name, os.O_RDWR)
        try:
            m = mmap.mmap(fd, layout["ranks"] + 2 * layout["rank_block"])
        finally:
            os.close(fd)
        rank1 = layout["ranks"] + layout["rank_block"]     # holds its slot, never counted
        m[rank1 + layout["pid"]:rank1 + layout["pid"] + 4] = os.getpid().to_bytes(4, "little")
        m[rank1 + layout["state"]:rank1 + layout["state"] + 4] = (1).to_bytes(4, "little")
        engine = _engine.Engine(segment.open_existing(name), 0, 2, token, params)
        try:
            with pytest.raises(shmcoll.TimeoutError,
                               match=rf"1 of 2 attachments counted in segment inode "
                                     rf"{seg.identity()[1]}"):
                engine.wait_attached()
        finally:
            engine.close(failed=True)
            m.close()
    finally:
        segment.unlink(name)
        del seg


def test_infinite_timeout_means_no_deadline():
    out = shmcoll.launch(late_allreduce, 2, args=(1, 0.5), timeout=float("inf"))
    assert out == [("ok", None, None)] * 2
    out = shmcoll.launch(late_allreduce, 2, args=(1, 0.3), timeout=1e300)
    assert out == [("ok", None, None)] * 2


def test_infinite_timeout_still_ends_when_a_peer_dies():
    with pytest.raises(shmcoll.LaunchError) as info:
        shmcoll.launch(kill_self_on, 2, args=(1,), timeout=float("inf"))
    assert "SIGKILL" in info.value.failures[1]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "10"])
def test_invalid_timeouts_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        EngineParams.from_env(2, bad)
    with pytest.raises((ValueError, TypeError)):
        shmcoll.launch(late_allreduce, 2, args=(0, 0), timeout=bad)


def test_infinite_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("SHMCOLL_TIMEOUT", "inf")
    assert EngineParams.from_env(2).timeout == float("inf")


# -- roots -------------------------------------------------------------------------
@pytest.mark.parametrize("root,error", [(2 ** 40, ValueError), (-1, ValueError), (1, ValueError),
                                        (True, TypeError), (1.0, TypeError), ("0", TypeError)])
def test_roots_are_integers_in_range(root, error):
    with shmcoll.init(rank=0, world_size=1, job="roots-" + secrets.token_hex(4)) as comm:
        x = np.ones(3, np.float32)
        for call in (lambda: comm.broadcast(x, root=root), lambda: comm.reduce(x, root=root),
                     lambda: comm.gather(x, root=root),
                     lambda: comm.scatter(np.ones((1, 3)), root=root)):
            with pytest.raises(error):
                call()
        assert comm.broadcast(x, root=np.int64(0)) is x     # integer types other than int
        assert comm.allreduce(x).tolist() == [1.0] * 3      # nothing was published


# -- messages ----------------------------------------------------------------------
def test_timeout_names_the_rank_that_never_came_not_the_live_peer_waited_for(tmp_path):
    # rank 2 comes only after ranks 0 and 1 have timed out
    flags = [str(tmp_path / f"done{r}") for r in range(2)]
    out = launch_timing_out_fast(late_allreduce, 3, args=(2, 0.0, flags))
    for rank in (0, 1):
        kind, _, text = out[rank]
        assert kind == "TimeoutError", out[rank]
        assert "rank(s) [2] never reached this call" in text, text


def test_peer_lost_message_names_the_rank_and_the_wait():
    with pytest.raises(shmcoll.LaunchError) as info:
        shmcoll.launch(kill_self_on, 3, args=(2,), timeout=30)
    text = str(info.value)
    assert "killed by signal SIGKILL" in text
    for line in text.splitlines():
        assert not line.rstrip().endswith(("of)", "to)", "from)")), line


def test_allocation_failure_is_reported_as_such():
    out = shmcoll.launch(allreduce_with_memory_limit, 2, args=(16 << 20,), timeout=60)
    kinds = {kind for kind, _, _ in out}
    assert "OutOfMemoryError" in kinds and kinds <= {"OutOfMemoryError", "PeerLostError"}, out
    text = next(t for k, _, t in out if k == "OutOfMemoryError")
    assert "accumulator" in text and "invalid" not in text
    assert issubclass(shmcoll.OutOfMemoryError, MemoryError)
