"""Waiting ranks sleep instead of burning a core; ranks may outnumber cores."""
import shmcoll
from workers import allreduce_loop, cpu_while_waiting


def test_a_rank_waiting_for_a_late_peer_does_not_burn_its_core():
    results = shmcoll.launch(cpu_while_waiting, 2, args=(1, 1.5))
    cpu, wall = results[0]
    assert wall > 1.0                # it really waited
    assert cpu < 0.25 * wall         # spin and yield phases are short, then it sleeps


def test_eight_ranks_on_few_cores_complete_a_loop_of_1_mib_allreduces():
    results = shmcoll.launch(allreduce_loop, 8, args=((1 << 20) // 4, 20))
    assert all(ok for ok, _, _ in results)
