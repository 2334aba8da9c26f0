"""Waiting ranks sleep instead of burning a core; ranks may outnumber cores."""
import shmcoll
from workers import allreduce_loop, cpu_while_waiting, other_thread_runs_while_waiting


def test_a_rank_waiting_for_a_late_peer_does_not_burn_its_core():
    results = shmcoll.launch(cpu_while_waiting, 2, args=(1, 1.5))
    cpu, wall = results[0]
    assert wall > 1.0                # it really waited
    assert cpu < 0.25 * wall         # spin and yield phases are short, then it sleeps


def test_a_small_call_waiting_for_a_late_peer_lets_other_threads_run():
    # Small calls keep the GIL through their first microseconds of waiting (cheaper
    # than dropping it); a wait that lasts must hand it over.  Held throughout, the
    # other thread would get ~1% of its baseline (a turn per signal check).
    baseline, counts = shmcoll.launch(other_thread_runs_while_waiting, 2, args=(1, 0.5))[0]
    assert all(n > baseline / 5 for n in counts), (baseline, counts)


def test_eight_ranks_on_few_cores_complete_a_loop_of_1_mib_allreduces():
    results = shmcoll.launch(allreduce_loop, 8, args=((1 << 20) // 4, 20))
    assert all(ok for ok, _, _ in results)
