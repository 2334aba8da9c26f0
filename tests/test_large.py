"""Large messages stream through the bounded segment."""
import shmcoll
from workers import large_allreduce_check


def test_64_mib_allreduce_at_p2_is_exact():
    count = (64 << 20) // 4 + 3      # 64 MiB and a ragged tail
    assert shmcoll.launch(large_allreduce_check, 2, args=(count, "float32")) == [0, 0]


def test_large_uneven_int64_allreduce_at_p3():
    count = (24 << 20) // 8 + 1
    assert shmcoll.launch(large_allreduce_check, 3, args=(count, "int64")) == [0, 0, 0]
