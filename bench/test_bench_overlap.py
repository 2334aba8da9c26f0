"""The overlap benchmark (bench/overlap.py) runs and its results are correct; its
timings are reported by running it directly, not judged here."""
import overlap


def test_overlap_benchmark_runs(tmp_path):
    out = tmp_path / "overlap.json"
    assert overlap.main(["-np", "1", "2", "--sizes", "64K", "--steps", "2", "--repeats", "1",
                         "--json", str(out)]) == 0
    assert out.exists()
