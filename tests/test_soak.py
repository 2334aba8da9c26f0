"""Many random collectives with every result checked; memory and /dev/shm stay flat.

`pytest tests/test_soak.py --soak-full` runs the full sizes (10,000 collectives at
P=4, 10^6 ring messages); by default a shortened run keeps the suite quick."""
import os

import shmcoll
from shmcoll._core import segment
from workers import ring_stress, soak


def shm_used_bytes():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_random_collectives_soak(soak_full):
    n_ops = 10_000 if soak_full else 300
    before_entries, before_used = set(segment.list_entries()), shm_used_bytes()
    max_bytes = 4 << 20
    results = shmcoll.launch(soak, 4, args=(n_ops, 1234, max_bytes), timeout=120)
    for wrong, first_half_peak, second_half_peak in results:
        assert wrong == []
        # one call's working set (inputs of all ranks for the check, out, copies) may
        # raise malloc's high-water mark late; a leak would grow with every call
        assert second_half_peak - first_half_peak < 16 * max_bytes
    assert set(segment.list_entries()) <= before_entries
    assert shm_used_bytes() - before_used < 1 << 20


def test_ring_buffer_stress_between_two_ranks(soak_full):
    n = 1_000_000 if soak_full else 20_000
    assert shmcoll.launch(ring_stress, 2, args=(n, 99, 3000)) == [0, 0]
