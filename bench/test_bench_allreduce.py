"""pytest-benchmark: allreduce between live ranks, timed end to end on rank 0.

    pytest bench --benchmark-autosave            # save a baseline
    pytest bench --benchmark-compare             # compare with the last one
"""
import pytest

pytest.importorskip("pytest_benchmark")
