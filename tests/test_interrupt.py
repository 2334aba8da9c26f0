"""Ctrl-C reaches a rank blocked in a long wait: the wait polls Python's signal
handlers while asleep, so KeyboardInterrupt is raised within a sleep slice."""
import secrets
import signal
import time

from procs import cleaned_up, rank_env, spawn
from shmcoll._core import segment


def start(where, rank, world, job):
    return spawn("interrupt_rank.py", where, **rank_env(job, rank, world))


def interrupt_and_wait(proc, delay):
    time.sleep(delay)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    return time.monotonic() - t0, err


def test_ctrl_c_interrupts_a_rank_waiting_to_join():
    job = "intr-" + secrets.token_hex(4)
    proc = start("init", 0, 2, job)
    took, err = interrupt_and_wait(proc, 1.5)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert took < 5
    assert not any(job in e for e in segment.list_entries())


def test_ctrl_c_interrupts_a_rank_blocked_in_allreduce():
    job = "intr-" + secrets.token_hex(4)
    waiter, sleeper = start("allreduce", 0, 2, job), start("allreduce", 1, 2, job)
    with cleaned_up([waiter, sleeper]):
        assert waiter.stdout.readline().strip() == "joined"
        took, err = interrupt_and_wait(waiter, 1.0)
        assert waiter.returncode != 0 and "KeyboardInterrupt" in err and "allreduce" in err
        assert took < 5
